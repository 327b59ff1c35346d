"""Reading a Llama GGUF (sf_trt.export.gguf_llama): config, weights, tokenizer, refusals."""

from __future__ import annotations

import re

import numpy as np
import pytest
from sf_trt.export.gguf_llama import GGUFError, check_gguf_file, load_gguf, open_reader, read_tokenizer
from tiny_gguf import SPECIALS, TEMPLATE, write_tiny_gguf


def test_load_gguf_round_trips_the_weights(tmp_path):
    cfg, weights = write_tiny_gguf(tmp_path / "tiny.gguf")
    got_cfg, got = load_gguf(tmp_path / "tiny.gguf")
    assert got_cfg == cfg
    assert np.array_equal(got.tok_embd, weights.tok_embd) and got.lm_head is None
    for a, b in zip(got.layers, weights.layers):
        assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "attn_norm"))


def test_load_gguf_refuses_another_architecture(tmp_path):
    write_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(GGUFError, match=r"gpt2\.gguf: architecture 'gpt2' is not supported \(supported: llama, mistral, qwen2, qwen3, gemma3, phi3\)"):
        load_gguf(tmp_path / "gpt2.gguf")


def test_load_gguf_names_a_type_it_cannot_dequantize(tmp_path):
    import gguf

    write_tiny_gguf(tmp_path / "q81.gguf", bad_type=gguf.GGMLQuantizationType.Q8_1)
    with pytest.raises(GGUFError, match=r"tensor 'blk\.1\.ffn_up\.weight' has type Q8_1, which gguf .* cannot dequantize"):
        load_gguf(tmp_path / "q81.gguf")


def test_load_gguf_refuses_missing_foreign_and_truncated_files(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        load_gguf(tmp_path / "absent.gguf")
    (tmp_path / "zip.gguf").write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(GGUFError, match=r"not a GGUF file \(expected magic b'GGUF', found b'PK\\x03\\x04'\)"):
        load_gguf(tmp_path / "zip.gguf")
    write_tiny_gguf(tmp_path / "full.gguf")
    data = (tmp_path / "full.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 3])
    with pytest.raises(GGUFError, match="cut.gguf: GGUF file is truncated or corrupt"):
        load_gguf(tmp_path / "cut.gguf")


def test_tokenizer_from_a_gguf(tmp_path):
    from sf_trt.tokenizer import Tokenizer

    write_tiny_gguf(tmp_path / "tiny.gguf")
    tok = read_tokenizer(open_reader(tmp_path / "tiny.gguf"))
    for text in ["the thethe", "é ü 日本 🙂", "<|im_start|>user\nhi<|im_end|>", "x 2024 y"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        stream = tok.stream()
        pieces = [stream.push(i) for i in ids] + [stream.flush()]
        assert "".join(pieces) == text
    assert tok.encode(" the") == [len(SPECIALS) + 256 + 2]
    assert tok.encode("<|im_end|>") == [2]
    stream = tok.stream()
    e_acute = tok.encode("é")  # two byte tokens
    assert len(e_acute) == 2 and stream.push(e_acute[0]) == "" and stream.push(e_acute[1]) == "é"
    assert tok.decode([1, 2], skip_special=True) == ""
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tok.save(tmp_path / "saved")
    again = Tokenizer.load(tmp_path / "saved")
    assert again.encode("the thethe é") == tok.encode("the thethe é") and again.chat_template == TEMPLATE
    assert (again.bos, again.eos) == (1, 2)


def test_the_gguf_is_smollm2_135m(real_weights):
    cfg, weights = real_weights
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab) == (30, 576, 9, 3, 64, 1536, 49152)
    assert cfg.tied_embeddings and weights.lm_head is None
    assert (cfg.bos, cfg.eos, cfg.rope_theta, cfg.context_length) == (1, 2, 100000.0, 8192)
    assert weights.tok_embd.shape == (49152, 576) and weights.layers[0].wk.shape == (192, 576)
    assert all(np.isfinite(getattr(weights.layers[29], f)).all() for f in ("wq", "w_down"))


@pytest.mark.parametrize(
    "meta, words",
    [
        ({"block_count": 10**9}, "llama.block_count 1000000000 needs 9000000002 tensors, the file holds 20"),
        ({"block_count": 3}, "llama.block_count 3 needs 29 tensors, the file holds 20"),
        ({"block_count": 1}, "tensor 'blk.1.attn_k.weight' lies beyond llama.block_count 1"),
        ({"embedding_length": 32}, "partial rotary embeddings (rope dims 16 of head dim 8)"),
        ({"embedding_length": 32, "rope_dimension_count": 8}, "tensor 'token_embd.weight' has shape (262, 64), the metadata implies (262, 32)"),
        ({"feed_forward_length": 4096}, "tensor 'blk.0.ffn_gate.weight' has shape (128, 64), the metadata implies (4096, 64)"),
        ({"head_count_kv": 4}, "tensor 'blk.0.attn_k.weight' has shape (32, 64), the metadata implies (64, 64)"),
        ({"context_length": 2**31}, "context_length 2147483648 exceeds 1048576"),
        ({"head_count": 0}, "llama.attention.head_count 0 is not a positive count"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_crafted_metadata_is_refused_before_anything_is_allocated(tmp_path, meta, words):
    import time

    write_tiny_gguf(tmp_path / "crafted.gguf", meta=meta)
    t0 = time.perf_counter()
    with pytest.raises(GGUFError, match=re.escape(words)) as err:
        load_gguf(tmp_path / "crafted.gguf")
    assert time.perf_counter() - t0 < 5 and "\n" not in str(err.value)
    with pytest.raises(GGUFError, match=re.escape(words)):
        check_gguf_file(tmp_path / "crafted.gguf")


def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path):
    def poison(name, arr):
        if name == "blk.1.attn_v.weight":
            arr = arr.copy()
            arr[3, 5] = np.nan
            arr[0, 0] = np.inf
        return arr

    write_tiny_gguf(tmp_path / "nan.gguf", tensor_fn=poison)
    with pytest.raises(GGUFError, match=r"tensor 'blk\.1\.attn_v\.weight' holds 2 non-finite values \(NaN or inf\); the file is damaged"):
        load_gguf(tmp_path / "nan.gguf")


FAMILY_FILES = {
    "llama": {}, "llama (llama3 rope_freqs, biases)": {"rope_factors": True, "biases": True}, "mistral": {}, "qwen2": {},
    "qwen3": {}, "gemma3": {}, "phi3": {},
}


@pytest.mark.parametrize("variant", list(FAMILY_FILES))
def test_every_family_round_trips_through_its_gguf(tmp_path, variant):
    """Each family's GGUF (fused matrices, transformers' rotary order where llama.cpp keeps it)
    loads back into the weights it was written from, every tensor used."""
    fam = variant.split()[0]
    cfg, weights = write_tiny_gguf(tmp_path / "m.gguf", family_name=fam, **FAMILY_FILES[variant])
    got_cfg, got = load_gguf(tmp_path / "m.gguf")
    assert got_cfg == cfg
    assert (got.rope_factors is None) == (weights.rope_factors is None)
    if weights.rope_factors is not None:
        assert np.array_equal(got.rope_factors, weights.rope_factors)
    assert (got.lm_head is None) == (weights.lm_head is None)
    for a, b in zip(got.layers, weights.layers):
        assert a.present() == b.present()
        for f in b.present():
            assert np.array_equal(getattr(a, f), getattr(b, f)), f


@pytest.mark.parametrize("fam, extra", [
    ("phi3", "blk.0.attn_q.bias"),  # phi3 has no biases
    ("qwen2", "rope_freqs.weight"),  # llama 3's rope divisors, in a family that has none
    ("llama", "blk.1.attn_q_norm.weight"),  # a qwen3 norm in a llama
])
def test_a_tensor_the_model_would_not_use_is_refused_naming_it(tmp_path, fam, extra):
    cfg, _ = write_tiny_gguf(tmp_path / "probe.gguf", family_name=fam)
    size = cfg.head_dim // 2 if extra == "rope_freqs.weight" else cfg.head_dim * (cfg.n_heads if "bias" in extra else 1)
    write_tiny_gguf(tmp_path / "m.gguf", family_name=fam, extra={extra: np.ones(size, np.float32)})
    with pytest.raises(GGUFError, match=rf"m\.gguf: tensor '{re.escape(extra)}' is not used by sf_trt's {fam} decoder; refusing to ignore it"):
        load_gguf(tmp_path / "m.gguf")


@pytest.mark.parametrize("fam, missing", [("qwen3", "blk.1.attn_k_norm.weight"), ("qwen2", "blk.0.attn_v.bias"), ("gemma3", "blk.0.post_ffw_norm.weight")])
def test_a_missing_tensor_is_refused_naming_it(tmp_path, fam, missing):
    write_tiny_gguf(tmp_path / "m.gguf", family_name=fam, skip=(missing,))
    with pytest.raises(GGUFError, match=rf"GGUF has no tensor '{re.escape(missing)}' \(expected a {fam} model\)"):
        load_gguf(tmp_path / "m.gguf")


def test_an_unsupported_rope_scaling_is_refused(tmp_path):
    write_tiny_gguf(tmp_path / "m.gguf", meta={"rope_scaling_type": "yarn"})
    with pytest.raises(GGUFError, match=r"rope scaling 'yarn' is not supported \(supported: none, linear, llama3's rope_freqs\.weight\)"):
        load_gguf(tmp_path / "m.gguf")


def test_llama3_rope_freqs_and_biases_change_the_model(tmp_path):
    """Once ignored without a word: a llama GGUF's rope_freqs.weight and biases now change the logits as the reference says."""
    import dataclasses

    import onnxruntime as ort
    from rows import close_to_reference

    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.reference import reference_forward

    cfg, weights = write_tiny_gguf(tmp_path / "m.gguf", rope_factors=True, biases=True)
    cfg, weights = load_gguf(tmp_path / "m.gguf")
    seq = np.arange(3, 43)
    ref = reference_forward(cfg, weights, seq)
    no_bias = dict.fromkeys(("bq", "bk", "bv", "bo", "b_gate", "b_up", "b_down"))
    plain = dataclasses.replace(weights, rope_factors=None, layers=[dataclasses.replace(layer, **no_bias) for layer in weights.layers])
    assert np.abs(reference_forward(cfg, plain, seq) - ref).max() > 1e-2
    model = build_decoder_graph(cfg, weights, max_lanes=1, max_context=64, cache_inputs="pass")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": seq[None], "positions": np.arange(40)[None], "logit_index": np.arange(40)}
    for i in range(cfg.n_layers):
        feeds[f"past_key_{i}"] = feeds[f"past_value_{i}"] = np.zeros((1, cfg.n_kv_heads, 65, cfg.head_dim), np.float32)
    close_to_reference(sess.run(["logits"], feeds)[0], ref)


@pytest.mark.parametrize("fam", ["llama", "phi3", "gemma3"])
def test_a_lazy_load_reads_each_tensor_when_it_is_used_and_gives_the_same_values(tmp_path, fam):
    from sf_trt.export.gguf_llama import LazyArray

    write_tiny_gguf(tmp_path / "m.gguf", family_name=fam)
    _, eager = load_gguf(tmp_path / "m.gguf")
    _, lazy = load_gguf(tmp_path / "m.gguf", lazy=True)
    assert isinstance(lazy.tok_embd, LazyArray) and isinstance(lazy.layers[1].wk, LazyArray)
    assert np.array_equal(np.asarray(lazy.tok_embd), eager.tok_embd)
    for a, b in zip(lazy.layers, eager.layers):
        assert a.present() == b.present()
        assert all(np.array_equal(np.asarray(getattr(a, f)), getattr(b, f)) for f in b.present())


def test_a_streamed_build_keeps_no_weight_in_the_graph_and_computes_the_same(tmp_path):
    """build_decoder_graph(external_data=...) appends each weight to the file as it is built: the
    graph holds none of their bytes, and the saved model computes what the in-memory one does."""
    import onnx
    import onnxruntime as ort

    from sf_trt.export.decoder_graph import build_decoder_graph

    write_tiny_gguf(tmp_path / "m.gguf", family_name="qwen3")
    cfg, lazy = load_gguf(tmp_path / "m.gguf", lazy=True)
    (tmp_path / "out").mkdir()
    streamed = build_decoder_graph(cfg, lazy, max_lanes=1, max_context=32, cache_inputs="pass", external_data=tmp_path / "out" / "w.data")
    assert sum(len(t.raw_data) for t in streamed.graph.initializer) < 64 * 1024  # the small constants only
    assert (tmp_path / "out" / "w.data").stat().st_size > 4 * cfg.vocab * cfg.hidden
    onnx.save_model(streamed, str(tmp_path / "out" / "m.onnx"))
    _, eager = load_gguf(tmp_path / "m.gguf")
    whole = build_decoder_graph(cfg, eager, max_lanes=1, max_context=32, cache_inputs="pass")
    feeds = {"input_ids": np.arange(3, 9)[None], "positions": np.arange(6)[None], "logit_index": np.arange(6)}
    for i in range(cfg.n_layers):
        feeds[f"past_key_{i}"] = feeds[f"past_value_{i}"] = np.zeros((1, cfg.n_kv_heads, 33, cfg.head_dim), np.float32)
    got = ort.InferenceSession(str(tmp_path / "out" / "m.onnx"), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    want = ort.InferenceSession(whole.SerializeToString(), providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
    assert np.array_equal(got, want)

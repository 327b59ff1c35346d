"""Reading a Llama GGUF (sf_trt.export.gguf_llama): config, weights, tokenizer, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from sf_trt.export.gguf_llama import GGUFError, load_gguf, open_reader, read_tokenizer
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

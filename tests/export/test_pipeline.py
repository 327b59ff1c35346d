"""GGUF to model directory (sf_trt.export.pipeline): what it writes, when it reuses."""

from __future__ import annotations

import os

from rows import close_to_reference, rows
from sf_trt.export.pipeline import export_model_dir
from sf_trt.export.reference import reference_forward
from tiny_gguf import SPECIALS, write_tiny_gguf

from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.formats.model_dir import ModelDir
from sf_trt.tokenizer import Tokenizer


def test_export_model_dir_writes_then_reuses(tmp_path):
    cfg, weights = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = export_model_dir(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    meta = ModelDir.open(out).meta
    assert ModelDir.open(out).config == cfg
    assert {"decoder.onnx", "decoder_pass.onnx", "decoder.onnx.data", "verify.onnx", "config.json", "tokenizer.json",
            "chat_template.jinja"} <= set(os.listdir(out))
    stamp = os.stat(out / "decoder.onnx").st_mtime_ns
    assert export_model_dir(tmp_path / "tiny.gguf", out, progress=False) == out
    assert os.stat(out / "decoder.onnx").st_mtime_ns == stamp  # reused
    tok = Tokenizer.load(out)
    assert tok.encode(" the") == [len(SPECIALS) + 256 + 2]
    ids = tok.encode("the the")
    with OrtDecoderPrimitives(out, max_lanes=1, max_context=32) as p:
        close_to_reference(p.forward(rows(0, 0, ids)), reference_forward(cfg, weights, ids))
    # another GGUF at the same place: rebuilt
    write_tiny_gguf(tmp_path / "tiny.gguf", seed=1)
    export_model_dir(tmp_path / "tiny.gguf", out, progress=False)
    assert ModelDir.open(out).gguf_sha256 != meta["gguf"]["sha256"]

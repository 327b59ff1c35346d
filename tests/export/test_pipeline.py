"""GGUF to model directory (sf_trt.export.pipeline): what it writes, when it reuses,
what it never destroys, and what an interrupted export leaves (nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from rows import close_to_reference, rows
from sf_trt.export.pipeline import OutDirError, export_model_dir
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


def _beside(out):
    """Entries next to ``out`` other than ``out`` itself (temporaries, old copies)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name not in (out.name, "tiny.gguf", "sub"))


def test_a_folder_of_other_files_is_never_replaced(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "notes"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(OutDirError, match=r"notes: not empty and not an sf_trt model directory \(holds thesis\.tex\); refusing"):
        export_model_dir(tmp_path / "tiny.gguf", out, progress=False)
    assert os.listdir(out) == ["thesis.tex"] and _beside(out) == []
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "file").write_text("a file")
    with pytest.raises(OutDirError, match="file: is a file, not a model directory"):
        export_model_dir(tmp_path / "tiny.gguf", tmp_path / "sub" / "file", progress=False)
    assert (tmp_path / "sub" / "file").read_text() == "a file"
    export_model_dir(tmp_path / "tiny.gguf", out, progress=False, force=True)  # asked for: replaced
    assert "thesis.tex" not in os.listdir(out) and ModelDir.open(out) and _beside(out) == []


def test_an_earlier_export_is_replaced_whole_and_nothing_is_left_beside(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    out = export_model_dir(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    first = ModelDir.open(out).gguf_sha256
    write_tiny_gguf(tmp_path / "tiny.gguf", seed=1)
    export_model_dir(tmp_path / "tiny.gguf", out, progress=False)
    assert ModelDir.open(out).gguf_sha256 != first and _beside(out) == []


def test_a_damaged_export_is_rebuilt_from_its_gguf(tmp_path):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    out = export_model_dir(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    data = bytearray((out / "decoder.onnx.data").read_bytes())
    data[100] ^= 0xFF
    (out / "decoder.onnx.data").write_bytes(bytes(data))
    export_model_dir(tmp_path / "tiny.gguf", out, progress=False)
    ModelDir.open(out)  # matches its digests again


def _wait_for_temporary(out, proc, timeout=300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.sf_trt-tmp-")]
        if found and any(found[0].iterdir()):
            return found[0]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    raise AssertionError("the export never started writing")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_an_export_killed_midway_keeps_the_earlier_one_and_leaves_no_temporary(real_gguf, tmp_path, sig):
    write_tiny_gguf(tmp_path / "tiny.gguf")
    out = export_model_dir(tmp_path / "tiny.gguf", tmp_path / "model", progress=False)
    earlier = ModelDir.open(out).gguf_sha256
    proc = subprocess.Popen(
        [sys.executable, "-m", "sf_trt.cli", "export", "--gguf", str(real_gguf), "--out", str(out), "--weights", "float32"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    _wait_for_temporary(out, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert ModelDir.open(out).gguf_sha256 == earlier  # the earlier export, whole
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err
        assert err.strip().splitlines()[-1] == "sf-trt: terminated by SIGTERM; unfinished files removed"
        assert _beside(out) == []
    else:
        assert proc.returncode == -signal.SIGKILL and len(_beside(out)) == 1  # nothing can clean up after SIGKILL ...
        export_model_dir(tmp_path / "tiny.gguf", out, progress=False)  # ... the next export does
        assert _beside(out) == []


def test_processes_sharing_the_cache_export_the_default_model_once(tmp_path):
    """Replicas of `sf-trt serve --ray` on one machine start together: the cache lock
    makes one export while the others wait, then reuse it (never each other's files)."""
    write_tiny_gguf(tmp_path / "tiny.gguf")
    env = {**os.environ, "SF_TRT_CACHE": str(tmp_path / "cache"), "SF_TRT_GGUF": str(tmp_path / "tiny.gguf")}
    code = "from sf_trt.export.pipeline import default_model_dir; print(default_model_dir())"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    (path,) = {out.strip() for out, _ in outs}
    assert sum(err.count("exported ") for _, err in outs) == 1, [err for _, err in outs]
    ModelDir.open(path)  # whole, every file matching its digest
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [os.path.basename(path)]  # nothing beside it


@pytest.mark.parametrize("weights", ["q4", "int4", "gguf"])
def test_q4_weights_on_dimensions_that_are_not_whole_blocks_get_one_line(tmp_path, weights):
    """Once a ValueError traceback: an ffn of 100 cannot be held in 4-bit blocks of 32. The one line
    names the matrix, its shape and the block."""
    from cli_run import sf_trt
    from tiny_gguf import write_tiny_gguf

    write_tiny_gguf(tmp_path / "odd.gguf", shape={"ffn": 100})
    proc = sf_trt("export", "--gguf", str(tmp_path / "odd.gguf"), "--out", str(tmp_path / "m"), "--weights", weights,
                  env={"SF_TRT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"sf-trt: --weights {weights}: the input dim (the last) of blk.*.ffn_down.weight [64, 100] is not a multiple of the block 32 (use --weights int8 or float32)"
    )
    assert not (tmp_path / "m").exists()


def test_q4_export_of_a_gguf_with_mixed_block_types_carries_its_4_bit_blocks(tmp_path):
    """A GGUF whose layer matrices are Q4_0, Q4_1, Q5_0, Q8_0 and F32 (q, k and v of three types in
    one fused matrix): ``--weights q4`` keeps the 4-bit ones' values exactly (the loader keeps their
    bytes), requantizes the rest, and the exported model computes those values."""
    from cli_run import sf_trt
    from rows import SEQ

    from sf_trt.export.gguf_llama import load_gguf
    from sf_trt.export.quantize import q4_weights

    types = {"attn_q.weight": "Q4_0", "attn_k.weight": "Q4_1", "attn_v.weight": "Q5_0", "ffn_gate.weight": "Q4_0", "ffn_down.weight": "Q8_0"}
    write_tiny_gguf(tmp_path / "mixed.gguf", types=types)
    cfg, weights = load_gguf(tmp_path / "mixed.gguf")
    assert {k.split(".")[-1]: v[0] for k, v in weights.blocks.items() if k.startswith("layers.0.")} == {
        "wq": "Q4_0", "wk": "Q4_1", "wv": "Q5_0", "w_gate": "Q4_0", "w_down": "Q8_0"}
    held = q4_weights(weights)
    for f in ("wq", "wk", "w_gate"):  # carried: the file's values
        np.testing.assert_allclose(getattr(held.layers[1], f), getattr(weights.layers[1], f), rtol=0, atol=1e-6)
    for f in ("wv", "w_down", "w_up"):  # requantized
        assert not np.array_equal(getattr(held.layers[1], f), getattr(weights.layers[1], f))
    proc = sf_trt("export", "--gguf", str(tmp_path / "mixed.gguf"), "--out", str(tmp_path / "m"), "--weights", "q4",
                  env={"SF_TRT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    with OrtDecoderPrimitives(tmp_path / "m", max_lanes=1, max_context=64) as p:
        got = p.forward(rows(0, 0, SEQ[:24]))
    want = reference_forward(cfg, held, SEQ[:24])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))


def test_int4_export_of_a_4_bit_gguf_says_it_rounds_the_file_s_blocks_again(tmp_path):
    """``--weights int4`` on a GGUF with Q4_0 and Q4_1 layer matrices: one progress line names the 4-bit
    types it requantizes and where to keep them (``--weights gguf``); the model directory records int4
    and computes the requantized values, the lm_head's too. A GGUF without 4-bit blocks gets no such line."""
    from cli_run import sf_trt
    from rows import SEQ

    from sf_trt.export.gguf_llama import load_gguf
    from sf_trt.export.quantize import q4_weights

    write_tiny_gguf(tmp_path / "q4.gguf", types={"attn_q.weight": "Q4_0", "ffn_gate.weight": "Q4_1"})
    env = {"SF_TRT_CACHE": str(tmp_path / "cache")}
    proc = sf_trt("export", "--gguf", str(tmp_path / "q4.gguf"), "--out", str(tmp_path / "m"), "--weights", "int4", env=env)
    assert proc.returncode == 0, proc.stderr
    assert ("sf_trt: --weights int4 requantizes the file's Q4_0, Q4_1 blocks too, rounding their values a second time "
            "(--weights gguf keeps them as they are; tools/q4_error.py --weights int4 measures by how much)") in proc.stderr.splitlines()
    assert ModelDir.open(tmp_path / "m").weights == "int4"
    cfg, weights = load_gguf(tmp_path / "q4.gguf")
    with OrtDecoderPrimitives(tmp_path / "m", max_lanes=1, max_context=64) as p:
        got = p.forward(rows(0, 0, SEQ[:24]))
    want = reference_forward(cfg, q4_weights(weights, "int4"), SEQ[:24])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
    write_tiny_gguf(tmp_path / "f32.gguf")
    proc = sf_trt("export", "--gguf", str(tmp_path / "f32.gguf"), "--out", str(tmp_path / "f"), "--weights", "int4", env=env)
    assert proc.returncode == 0 and "a second time" not in proc.stderr, proc.stderr


def test_gguf_weights_hold_every_matrix_in_its_own_blocks(tmp_path):
    """``--weights gguf``: each layer matrix in its own GGUF blocks, 4-bit where the fused matrix is all
    Q4_*, else 8-bit, no value changed (q and k Q4_0 and Q4_1 with v Q5_0: one 8-bit matrix); an F32
    matrix in Q8_0. The export computes those values, its rows as exact in any pass as q4's."""
    from cli_run import sf_trt
    from onnx import load as load_onnx
    from rows import SEQ

    from sf_trt.export.gguf_llama import load_gguf
    from sf_trt.export.quantize import q4_weights

    types = {"attn_q.weight": "Q4_0", "attn_k.weight": "Q4_1", "attn_v.weight": "Q5_0", "ffn_gate.weight": "Q4_0",
             "ffn_up.weight": "Q5_1", "ffn_down.weight": "Q8_0", "attn_output.weight": "Q4_1"}
    write_tiny_gguf(tmp_path / "mixed.gguf", types=types)
    cfg, weights = load_gguf(tmp_path / "mixed.gguf")
    held = q4_weights(weights, "gguf")
    for f in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):  # every one the file's values
        np.testing.assert_allclose(getattr(held.layers[1], f), getattr(weights.layers[1], f), rtol=0, atol=1e-6)
    proc = sf_trt("export", "--gguf", str(tmp_path / "mixed.gguf"), "--out", str(tmp_path / "m"), "--weights", "gguf",
                  env={"SF_TRT_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    bits = {n.input[1]: {a.name: a.i for a in n.attribute}["bits"] for n in load_onnx(str(tmp_path / "m" / "decoder.onnx")).graph.node
            if n.op_type == "MatMulNBits"}
    assert {k: v for k, v in bits.items() if k.startswith("l0.")} == {"l0.w_qkv.q8": 8, "l0.w_o.q4": 4, "l0.w_gate_up.q8": 8, "l0.w_down.q8": 8}
    with OrtDecoderPrimitives(tmp_path / "m", max_lanes=1, max_context=64) as p:
        got = p.forward(rows(0, 0, SEQ[:24]))
    want = reference_forward(cfg, held, SEQ[:24])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))


def test_auto_weights_keep_4bit_gguf_blocks_from_1b_parameters_up(tmp_path, monkeypatch):
    """``--weights auto`` (the default): int8 for the default model, a checkpoint, a GGUF under
    1B parameters or one without 4-bit blocks, and under another precision; ``gguf`` for a GGUF of
    1B+ parameters in 4-bit blocks (here the threshold lowered to the tiny model's size)."""
    from sf_trt.export import pipeline

    layer = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
    write_tiny_gguf(tmp_path / "q4.gguf", types={name: "Q4_0" for name in layer})
    write_tiny_gguf(tmp_path / "f32.gguf")
    assert pipeline.auto_weights(None) == ("int8", "the default model")
    assert pipeline.auto_weights(tmp_path)[0] == "int8"  # a directory: a checkpoint's float weights
    weights, why = pipeline.auto_weights(tmp_path / "q4.gguf")
    assert weights == "int8" and "under 1B" in why
    monkeypatch.setattr(pipeline, "AUTO_NBITS_PARAMETERS", 1)
    weights, why = pipeline.auto_weights(tmp_path / "q4.gguf")
    assert weights == "gguf" and "Q4_0" in why
    assert pipeline.auto_weights(tmp_path / "q4.gguf", "fp16")[0] == "int8"
    weights, why = pipeline.auto_weights(tmp_path / "f32.gguf")
    assert weights == "int8" and "not 4-bit GGUF blocks" in why
    weights, why = pipeline.auto_weights(tmp_path / "missing.gguf")
    assert weights == "int8" and "did not read" in why

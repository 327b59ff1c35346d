"""``sf-trt build``: the check's exit codes and output (no TensorRT needed)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper
from sf_trt.cli import main


def model(nodes, inputs, outputs, inits=()):
    graph = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


def relu():
    return model([h.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", T.FLOAT, ["rows", 512])], [vi("y", T.FLOAT, ["rows", 512])])


def topk_k4000():
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], name="topk_big")
    k = numpy_helper.from_array(np.array([4000], np.int64), "k")
    return model([node], [vi("x", T.FLOAT, ["rows", 8192])], [vi("v", T.FLOAT, None), vi("i", T.INT64, None)], [k])


def bitshift():
    node = h.make_node("BitShift", ["xi", "xi"], ["yi"], name="hash_shift", direction="LEFT")
    return model([node], [vi("xi", T.INT64, ["rows"])], [vi("yi", T.INT64, None)])


def cumsum_runtime_axis():
    node = h.make_node("CumSum", ["x", "axis"], ["y"], name="cdf")
    return model([node], [vi("x", T.FLOAT, ["rows", 512]), vi("axis", T.INT64, [])], [vi("y", T.FLOAT, None)])


def test_cli_check_exit_codes(tmp_path, capsys):
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir(), bad.mkdir()
    onnx.save(relu(), good / "relu.onnx")
    onnx.save(topk_k4000(), bad / "topk.onnx")
    onnx.save(bitshift(), bad / "shift.onnx")

    assert main(["build", "--check", str(good)]) == 0
    assert "supported" in capsys.readouterr().out

    assert main(["build", "--check", str(good), str(bad)]) == 1
    out = capsys.readouterr()
    assert "topk_big" in out.out and "hash_shift" in out.out and "relu.onnx: ok" in out.out
    assert "2 of 3 graph(s)" in out.err

    assert main(["build", "--check", str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert main(["build", "--check", str(tmp_path / "junk.onnx")]) == 2
    assert "cannot load" in capsys.readouterr().err
    assert main(["build", "--check"]) == 2  # nothing to check
    capsys.readouterr()


def unbounded_int64_mod():
    """``key % 1000003`` on an int64 input with no declared range (export/OPS.md, "Integer arithmetic")."""
    m = numpy_helper.from_array(np.array(1000003, np.int64), "m")
    return model([h.make_node("Mod", ["xi", "m"], ["yi"], name="key_mod")], [vi("xi", T.INT64, ["rows"])], [vi("yi", T.INT64, None)], [m])


def test_cli_check_refuses_an_unbounded_integer_mod_naming_it(tmp_path, capsys):
    onnx.save(unbounded_int64_mod(), tmp_path / "mod.onnx")
    assert main(["build", "--check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "key_mod (Mod)" in out and "no declared range" in out and "2**24" in out and "#4702" in out


def test_cli_check_registry(capsys):
    rc = main(["build", "--check", "--registry"])
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err


def test_a_bad_flag_is_an_argparse_refusal_without_a_traceback(tmp_path):
    onnx.save(relu(), tmp_path / "relu.onnx")
    proc = subprocess.run([sys.executable, "-m", "sf_trt.cli", "build", "--check", "--max-opset", "zero", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "--max-opset" in proc.stderr


def test_python_dash_m_runs_the_check(tmp_path):
    onnx.save(cumsum_runtime_axis(), tmp_path / "cdf.onnx")
    proc = subprocess.run([sys.executable, "-m", "sf_trt.cli", "build", "--check", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert "cdf (CumSum)" in proc.stdout and "Traceback" not in proc.stderr


def test_check_of_a_fresh_export_lists_the_one_shape_of_each_engine(tmp_path, capsys):
    """A model directory stands for the engines the TensorRT backend opens: decoder and verify."""
    from sf_trt.export.pipeline import export_model_dir
    from tiny_gguf import write_tiny_gguf

    write_tiny_gguf(tmp_path / "tiny.gguf")
    out = export_model_dir(tmp_path / "tiny.gguf", tmp_path / "model", progress=False, precision="fp16")
    assert main(["build", "--check", str(out), "--max-lanes", "2", "--rows-per-lane", "3", "--max-context", "32"]) == 0
    text = capsys.readouterr().out
    assert "decoder.onnx: ok" in text and "verify.onnx: ok" in text and "decoder_pass.onnx: ok" not in text
    # which decoder each backend gets: onnxruntime's pass form is not built
    assert (f"{out / 'decoder_pass.onnx'}: onnxruntime's decoder (its CPU backend loads it, as decoder.onnx, in its contrib ops "
            f"RotaryEmbedding, SkipSimplifiedLayerNormalization and its attention as ONNX Attention), not a TensorRT engine; "
            f"TensorRT builds {out / 'decoder.onnx'}") in text
    assert "engine: decoder, fp16, one shape: batch=2 rows_per_lane=3 logit_rows=6 max_lanes=2 cache_len=33" in text
    assert "engine: verify, fp32, one shape: rows=6" in text
    assert "input  float16  [2, 2, 33, 16]" in text  # the KV cache, in the decoder's precision
    assert "all 2 graph(s) supported" in text

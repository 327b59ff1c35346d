"""The backend registry (sf_trt.backends): one list, opened by name, imported lazily."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from manifests import write_engines_dir

from sf_trt.abi import Status, StatusError
from sf_trt.backends import BACKENDS, Backend, names, open_model, register


def test_importing_the_registry_imports_no_backend():
    code = "import sys, sf_trt.backends; print(sorted(m for m in ('onnxruntime', 'tensorrt', 'torch') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_an_unknown_backend_is_refused_naming_the_known_ones(tiny_model_dir):
    with pytest.raises(StatusError, match=r"open_model\('cuda-magic'\): unknown backend \(known: .*onnxruntime.*tensorrt"):
        open_model("cuda-magic", tiny_model_dir, max_lanes=1, max_context=16)
    assert names() == sorted(BACKENDS) and {"onnxruntime", "onnxruntime-cuda", "onnxruntime-trt", "tensorrt"} <= set(names())


def test_onnxruntime_opens_the_model_directory(tiny_model_dir):
    prims = open_model("onnxruntime", tiny_model_dir, max_lanes=2, max_context=32, threads=1)
    assert (prims.capabilities.max_lanes, prims.capabilities.max_context) == (2, 32)
    assert prims.spinning is False  # threads sleep between ops unless asked
    prims.close()
    prims = open_model("onnxruntime", tiny_model_dir, max_lanes=1, max_context=32, threads=1, spinning=True)
    assert prims.spinning is True and prims._session_config("all")["session.intra_op.allow_spinning"] == "1"
    prims.close()


def test_a_gpu_provider_missing_here_is_refused_in_one_line(tiny_model_dir):
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(StatusError, match=r"onnxruntime here has no CUDAExecutionProvider \(available: .*install onnxruntime-gpu\)") as err:
        open_model("onnxruntime-cuda", tiny_model_dir, max_lanes=1, max_context=16)
    assert err.value.status == Status.UNSUPPORTED


def test_tensorrt_without_tensorrt_is_refused_clearly(tiny_model_dir, tmp_path):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is importable here")
    with pytest.raises(StatusError, match="no manifest at") as err:  # the manifest is checked first
        open_model("tensorrt", tiny_model_dir, max_lanes=1, max_context=16, engines=tmp_path)
    assert err.value.status == Status.UNSUPPORTED
    with pytest.raises(StatusError, match="TensorRT not available") as err:
        open_model("tensorrt", tiny_model_dir, max_lanes=1, max_context=16, engines=write_engines_dir(tmp_path / "engines"))
    assert err.value.status == Status.UNSUPPORTED


def test_register_checks_the_opener_and_adds_a_choice(tiny_model_dir):
    with pytest.raises(StatusError, match=r"expected 'module:function'"):
        register(Backend("broken", "no_colon_here", "?"))
    register(Backend("ort-one-thread", "sf_trt.backends.ort_decoder:open_model", "test", {"providers": ("CPUExecutionProvider",)}))
    try:
        prims = open_model("ort-one-thread", tiny_model_dir, max_lanes=1, max_context=16)
        assert prims.capabilities.max_lanes == 1
        prims.close()
    finally:
        del BACKENDS["ort-one-thread"]

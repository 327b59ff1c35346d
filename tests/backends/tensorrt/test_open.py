"""TensorRTPrimitives.open: the manifest and the engine files are checked before TensorRT is looked for,
so a machine without TensorRT still says what is wrong with them."""

from __future__ import annotations

import json

import pytest
from manifests import write_engines_dir

from sf_trt.abi import Status, StatusError
from sf_trt.backends.tensorrt import TensorRTPrimitives


def _damage(case, engines):
    manifest = engines / "manifest.json"
    data = json.loads(manifest.read_text())
    if case == "missing":
        manifest.unlink()
    elif case == "malformed":
        manifest.write_text("{not json")
    elif case == "escaping":
        data["engines"]["decoder"]["engine_file"] = "../../etc/passwd"
        manifest.write_text(json.dumps(data))
    elif case == "digest":
        (engines / "decoder.engine").write_bytes(b"not the engine that was built")
    elif case == "no engine":
        del data["engines"]["verify"]
        manifest.write_text(json.dumps(data))
    elif case == "dynamic profile":  # an engine built to take 1..8 rows: its rows could differ by the pass
        profile = data["engines"]["verify"]["settings"]["profiles"][0]
        profile["dims"]["rows"][0] = 1
        for shapes in profile["inputs"].values():
            shapes["min"][0] = 1
        manifest.write_text(json.dumps(data))


CASES = {
    "missing": "no manifest at",
    "malformed": "cannot read manifest",
    "escaping": "engine_file '../../etc/passwd' is not a path inside the engines directory",
    "digest": "refusing engine 'decoder': engine file sha256",
    "no engine": "no engine 'verify' in",
    "dynamic profile": r"engine 'verify' takes more than one shape \(rows 1..8, input lanes \[1\]..\[8\], input positions \[1\]..\[8\]\)",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_manifest_problems_are_reported_before_tensorrt_is_looked_for(tmp_path, case):
    engines = write_engines_dir(tmp_path / "engines")
    _damage(case, engines)
    with pytest.raises(StatusError, match=CASES[case]) as err:
        TensorRTPrimitives.open(engines, model="decoder", verify="verify")
    assert err.value.status == Status.UNSUPPORTED and "TensorRT not available" not in str(err.value)


def _stack(monkeypatch, trt, *, wheel="tensorrt-cu12"):
    """Stand-ins for tensorrt and torch (tests/trt_fakes.py), and the versions the probes read."""
    import sys

    from trt_fakes import FakeTorch

    from sf_trt.backends.tensorrt import probes

    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "torch", FakeTorch())
    monkeypatch.setattr(probes, "_driver_version", lambda: "570.86.15")
    monkeypatch.setattr(probes, "_driver_cuda", lambda: "12.8")
    monkeypatch.setattr(probes, "_tensorrt_wheel", lambda: wheel)


def test_a_runtime_that_cannot_start_is_one_line_naming_the_stack(tmp_path, monkeypatch):
    from trt_fakes import NULLPTR, FakeTrt

    _stack(monkeypatch, FakeTrt("10.13.0", runtime_error=NULLPTR))
    with pytest.raises(StatusError) as err:
        TensorRTPrimitives.open(write_engines_dir(tmp_path / "engines"), model="decoder", verify="verify")
    assert err.value.status == Status.UNSUPPORTED and "\n" not in str(err.value)
    assert str(err.value) == (
        "TensorRTPrimitives: trt.Runtime could not start (TypeError: pybind11::init(): factory function returned nullptr); "
        "found driver 570.86.15 (CUDA 12.8), CUDA runtime 12.8 (torch 2.8.0+fake), TensorRT 10.13.0 (tensorrt-cu12), "
        "GPU Fake H200 (compute capability 9.0); is a GPU visible, and does the driver support the CUDA of TensorRT's wheel?"
    )


def test_a_tensorrt_wheel_of_another_cuda_major_than_torch_is_refused(tmp_path, monkeypatch):
    from trt_fakes import FakeTrt

    _stack(monkeypatch, FakeTrt("10.13.0"), wheel="tensorrt-cu13")
    with pytest.raises(StatusError, match=r"^TensorRTPrimitives: TensorRT's wheel is tensorrt-cu13 \(CUDA 13\) but torch 2\.8\.0\+fake runs CUDA 12\.8: install sf_trt\[gpu-cu12\]"):
        TensorRTPrimitives.open(write_engines_dir(tmp_path / "engines"), model="decoder", verify="verify")

"""What this machine has (sf_trt.backends.tensorrt.probes): the supported TensorRT range, refused in one line."""

from __future__ import annotations

import itertools
import re
import sys
import tomllib
import types
from pathlib import Path

import pytest

from sf_trt.backends.tensorrt import TensorRTUnavailable
from sf_trt.backends.tensorrt.probes import CUDA_MAJORS, TENSORRT_REQUIREMENT, check_tensorrt_version, import_tensorrt

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("version, want", [("10.12.0.36", (10, 12)), ("10.13.0.35", (10, 13)), ("11.1.0", (11, 1)), ("11.4.0.106", (11, 4))])
def test_supported_versions_pass(version, want):
    assert check_tensorrt_version(version) == want


@pytest.mark.parametrize("version", ["8.6.1", "9.3.0.1", "10.0.1.6", "10.1.0", "10.11.0.33", "12.0.0", "13.1", "x.y", "10"])
def test_other_versions_are_refused_in_one_line_naming_the_range(version):
    """10.0 to 10.11 are below the floor: no DISTRIBUTIVE_INDEPENDENCE, and 10.0/10.1's parser is laxer
    than the op table sf-trt build --check applies."""
    with pytest.raises(TensorRTUnavailable) as err:
        check_tensorrt_version(version)
    assert "tensorrt>=10.12,<12" in str(err.value) and "\n" not in str(err.value)


def test_import_tensorrt_refuses_an_installed_tensorrt_outside_the_range(monkeypatch):
    """The version check on what ``import tensorrt`` returns (a module object that only has a
    version: nothing is built or run)."""
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="12.0.0"))
    with pytest.raises(TensorRTUnavailable, match=r"^TensorRT 12\.0\.0 found; sf_trt supports tensorrt>=10\.12,<12") as err:
        import_tensorrt()
    assert "\n" not in str(err.value)
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.13.0.35"))
    assert import_tensorrt().__version__ == "10.13.0.35"


def _extras() -> tuple[list[str], dict[str, list[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"], project["optional-dependencies"]


def _names(requirements) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def _resolve(extras: tuple[str, ...]) -> set[str]:
    """The distributions ``pip install 'sf_trt[<extras>]'`` asks for (self-references expanded)."""
    core, optional = _extras()
    wanted, todo = set(_names(core)), list(extras)
    while todo:
        for req in optional[todo.pop()]:
            m = re.fullmatch(r"sf_trt\[(.*)\]", req)
            if m:
                todo += m.group(1).split(",")
            else:
                wanted |= _names([req])
    return wanted


@pytest.mark.parametrize("major", CUDA_MAJORS)
def test_each_gpu_extra_names_its_cuda_major_and_the_supported_range(major):
    _, optional = _extras()
    extra = optional[f"gpu-cu{major}"]
    assert f"tensorrt-cu{major}" + TENSORRT_REQUIREMENT.removeprefix("tensorrt") in extra
    assert f"cuda-python>={major},<{major + 1}" in extra and "torch" in extra
    assert "gpu" not in optional  # an extra with no CUDA major resolved tensorrt to whatever wheel came first


def test_onnxruntime_gpu_never_sits_beside_onnxruntime():
    """Both wheels write the package ``onnxruntime``: whichever installs last wins, file by file. The
    core needs onnxruntime, so no extra, alone or combined with any other, may bring onnxruntime-gpu."""
    _, optional = _extras()
    for r in range(1, 4):
        for combo in itertools.combinations(sorted(optional), r):
            names = _resolve(combo)
            assert "onnxruntime" in names and "onnxruntime-gpu" not in names, combo


def test_both_onnxruntime_wheels_installed_are_found(monkeypatch):
    from importlib import metadata

    from sf_trt.backends.tensorrt.probes import onnxruntime_distributions

    files = {"onnxruntime": ["onnxruntime/__init__.py"], "onnxruntime_gpu": ["onnxruntime/capi/_pybind_state.py"],
             "onnxruntime-genai": ["onnxruntime_genai/__init__.py"], "numpy": ["numpy/__init__.py"]}
    dists = [types.SimpleNamespace(metadata={"Name": n}, files=f) for n, f in files.items()]
    monkeypatch.setattr(metadata, "distributions", lambda: dists)
    assert onnxruntime_distributions() == ["onnxruntime", "onnxruntime-gpu"]
    monkeypatch.undo()
    assert onnxruntime_distributions() == ["onnxruntime"]  # this machine: the core's wheel alone


@pytest.mark.parametrize("versions, problem", [
    (dict(tensorrt_wheel="tensorrt-cu13", torch_cuda="12.8", torch="2.8.0"),
     "TensorRT's wheel is tensorrt-cu13 (CUDA 13) but torch 2.8.0 runs CUDA 12.8: install sf_trt[gpu-cu12] (the extra of torch's CUDA major)"),
    (dict(tensorrt_wheel="tensorrt-cu12", torch_cuda="12.8", driver="535.104.05", driver_cuda="12.2"), None),
    (dict(tensorrt_wheel="tensorrt-cu13", torch_cuda="13.0", driver="535.104.05", driver_cuda="12.2"),
     "TensorRT needs CUDA 13 but the driver (535.104.05) supports CUDA 12.2: update the driver"),
    (dict(tensorrt_wheel=None, torch_cuda=None), None),  # nothing known: nothing to say
    (dict(tensorrt_wheel="tensorrt-cu12 + tensorrt-cu13", torch_cuda="12.8"),
     "TensorRT wheels of several CUDA majors are installed (tensorrt-cu12 + tensorrt-cu13): keep the one of torch's CUDA"),
])
def test_a_stack_whose_cuda_majors_disagree_is_named_in_one_line(versions, problem):
    from sf_trt.backends.tensorrt.probes import StackVersions, cuda_mismatch

    assert cuda_mismatch(StackVersions(**versions)) == problem


def test_the_stack_line_says_what_was_not_found():
    from sf_trt.backends.tensorrt.probes import StackVersions

    line = StackVersions(tensorrt="10.13.0.35", tensorrt_wheel="tensorrt-cu12").line()
    assert line == "driver not found (CUDA not found), CUDA runtime not found (torch not found), TensorRT 10.13.0.35 (tensorrt-cu12)"

"""What this machine has (sf_trt.backends.tensorrt.probes): the supported TensorRT range, refused in one line."""

from __future__ import annotations

import sys
import tomllib
import types
from pathlib import Path

import pytest

from sf_trt.backends.tensorrt import TensorRTUnavailable
from sf_trt.backends.tensorrt.probes import TENSORRT_REQUIREMENT, check_tensorrt_version, import_tensorrt

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("version, want", [("10.0.1.6", (10, 0)), ("10.13.0.35", (10, 13)), ("11.1.0", (11, 1)), ("11.4.0.106", (11, 4))])
def test_supported_versions_pass(version, want):
    assert check_tensorrt_version(version) == want


@pytest.mark.parametrize("version", ["8.6.1", "9.3.0.1", "12.0.0", "13.1", "x.y", "10"])
def test_other_versions_are_refused_in_one_line_naming_the_range(version):
    with pytest.raises(TensorRTUnavailable) as err:
        check_tensorrt_version(version)
    assert "tensorrt>=10.0,<12" in str(err.value) and "\n" not in str(err.value)


def test_import_tensorrt_refuses_an_installed_tensorrt_outside_the_range(monkeypatch):
    """The version check on what ``import tensorrt`` returns (a module object that only has a
    version: nothing is built or run)."""
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="12.0.0"))
    with pytest.raises(TensorRTUnavailable, match=r"^TensorRT 12\.0\.0 found; sf_trt supports tensorrt>=10\.0,<12") as err:
        import_tensorrt()
    assert "\n" not in str(err.value)
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="10.9.0.34"))
    assert import_tensorrt().__version__ == "10.9.0.34"


def test_the_gpu_extra_states_the_same_range():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert TENSORRT_REQUIREMENT in extra

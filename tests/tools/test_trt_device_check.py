"""tools/trt_device_check.py where there is no GPU: its help, and one line saying what is missing.

Its checks run on the onnxruntime stand-in in tests/backends/tensorrt/test_stand_in.py.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "trt_device_check.py"


def test_help_works_anywhere():
    proc = subprocess.run([sys.executable, str(TOOL), "--help"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stderr == ""
    for flag in ("--out", "--json", "--gguf", "--skip-real", "--max-tokens"):
        assert flag in proc.stdout
    assert "Exit status" in proc.stdout


def test_without_tensorrt_or_a_gpu_it_says_so_in_one_line_and_exits_2(tmp_path):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is importable here: the refusal path is not reachable")
    proc = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("trt_device_check: TensorRT not available: ") and "NVIDIA GPU" in proc.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "r.json").exists()  # nothing was run

"""Fixtures for the tests of ``tools/``: the scripts are not a package, so they are loaded by path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools"


@pytest.fixture
def load_tool():
    """``load_tool("name")``: the module ``tools/name.py``, loaded (and registered) by path."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
        tool = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = tool
        spec.loader.exec_module(tool)
        return tool

    return load

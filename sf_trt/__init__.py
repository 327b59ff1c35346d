"""sf_trt: exact speculative decoding on ONNX Runtime and TensorRT.

``sf_trt.LLM`` opens a model and generates from Python (:mod:`sf_trt.entrypoints`);
``sf_trt.SamplingParams`` and the other names SPEC.md pins come from :mod:`sf_trt.abi`.
Importing the package is light and needs neither a GPU nor TensorRT: ``LLM`` and the
other entry-point names are imported on first use, and backends import their heavy
dependencies when they are opened.
"""

from __future__ import annotations

from typing import Any

from .abi import CertMode, Exactness, Finish, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from .version import __version__


_LAZY = ("LLM", "ModelSpec", "BackendSpec", "SchedulerConfig", "RequestOutput")
"""Names imported on first use (so ``import sf_trt`` stays light)."""

__all__ = ["__version__", "CertMode", "Exactness", "Finish", "Sampling", "SamplingFlag", "SamplingParams", "Status", "StatusError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in ("LLM", "ModelSpec"):
        from . import entrypoints

        return getattr(entrypoints, name)
    if name == "BackendSpec":
        from .backends import BackendSpec

        return BackendSpec
    if name == "SchedulerConfig":
        from .scheduler import SchedulerConfig

        return SchedulerConfig
    if name == "RequestOutput":
        from .outputs import RequestOutput

        return RequestOutput
    raise AttributeError(f"module 'sf_trt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

"""The backends that run a model directory, by name: the one list the command line uses.

Each :class:`Backend` names an *opener*, ``"module:function"``, called as
``function(model_dir, *, max_lanes, max_context, threads, engines, **options)``
and returning a :class:`~sf_trt.primitives.PrimitivesBase`. The module is
imported only when the backend is opened (:func:`open_model`), so
``import sf_trt.backends`` costs nothing and needs no GPU; an unknown name is
refused by listing the known ones. Add a backend by adding an entry (or
calling :func:`register`).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any, Mapping

from ..abi import Status, StatusError

__all__ = ["Backend", "BACKENDS", "BackendSpec", "names", "register", "open_model"]


@dataclasses.dataclass(frozen=True)
class Backend:
    """A backend by name: its opener and the options it is opened with."""

    name: str
    opener: str
    """``"module:function"``, imported when the backend is opened."""
    summary: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


_CPU = ("CPUExecutionProvider",)
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("onnxruntime", "sf_trt.backends.ort_decoder:open_model", "onnxruntime on the CPU (the default)",
                {"providers": _CPU}),
        Backend("onnxruntime-cuda", "sf_trt.backends.ort_decoder:open_model", "onnxruntime-gpu's CUDA execution provider",
                {"providers": ("CUDAExecutionProvider", *_CPU)}),
        Backend("onnxruntime-trt", "sf_trt.backends.ort_decoder:open_model",
                "onnxruntime-gpu's TensorRT execution provider (engines cached under --engines/ort_trt)",
                {"providers": (("TensorrtExecutionProvider", {"trt_engine_cache_enable": True}), "CUDAExecutionProvider", *_CPU)}),
        Backend("tensorrt", "sf_trt.backends.tensorrt.primitives:open_model",
                "TensorRT engines built by `sf-trt build` (--engines)"),
    )
}


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """What to run a model directory on: the backend's ``name`` (a :data:`BACKENDS` key),
    onnxruntime's intra-op ``threads`` (None: one per core), the TensorRT ``engines``
    directory (``tensorrt``; ``onnxruntime-trt`` caches its engines under it) and
    ``spinning`` (onnxruntime's threads spin between ops instead of sleeping)."""

    name: str = "onnxruntime"
    threads: int | None = None
    engines: str | os.PathLike | None = "engines"
    spinning: bool = False

    def __post_init__(self) -> None:
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1):
            raise StatusError(Status.BAD_ARGUMENT, f"BackendSpec: threads must be None or an int >= 1 (got {self.threads!r})")

    def open(self, model_dir: str | os.PathLike, *, max_lanes: int, max_context: int):
        """This backend opened on ``model_dir`` (:func:`open_model`)."""
        return open_model(self.name, model_dir, max_lanes=max_lanes, max_context=max_context, threads=self.threads,
                          engines=self.engines, spinning=self.spinning)


def names() -> list[str]:
    return sorted(BACKENDS)


def register(backend: Backend) -> None:
    """Add (or replace) a backend."""
    module, sep, fn = backend.opener.partition(":")
    if not (backend.name and module and sep and fn):
        raise StatusError(Status.BAD_ARGUMENT, f"register({backend.name!r}): opener {backend.opener!r}, expected 'module:function'")
    BACKENDS[backend.name] = backend


def open_model(
    name: str,
    model_dir: str | os.PathLike,
    *,
    max_lanes: int,
    max_context: int,
    threads: int | None = None,
    engines: str | os.PathLike | None = None,
    spinning: bool = False,
):
    """Backend ``name`` opened on ``model_dir`` with ``max_lanes`` slots of ``max_context`` positions;
    ``spinning``: onnxruntime's intra-op threads spin between ops (see ``OrtDecoderPrimitives``)."""
    backend = BACKENDS.get(name)
    if backend is None:
        raise StatusError(Status.BAD_ARGUMENT, f"open_model({name!r}): unknown backend (known: {', '.join(names())})")
    module_name, _, fn_name = backend.opener.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StatusError(Status.UNSUPPORTED, f"open_model({name!r}): {module_name} cannot be imported here ({exc})") from None
    opener = getattr(module, fn_name, None)
    if opener is None:
        raise StatusError(Status.UNSUPPORTED, f"open_model({name!r}): {module_name} has no {fn_name}")
    return opener(
        model_dir, max_lanes=max_lanes, max_context=max_context, threads=threads, engines=engines, spinning=spinning,
        **backend.options,
    )

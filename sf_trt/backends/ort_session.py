"""onnxruntime sessions, set up one way everywhere.

Every session sf_trt opens (the decoder, the verify-and-sample graphs, the copy
model, the TensorRT stand-in) comes from :func:`open_session`: sequential
execution, one inter-op thread, ``threads`` intra-op threads (None: one per
core) and a graph optimization level by name. :func:`providers_for` checks
that the execution providers asked for exist in this onnxruntime.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from ..abi import Status, StatusError

__all__ = ["OPTIMIZATION_LEVELS", "open_session", "providers_for"]

OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")


def open_session(
    model: Any,
    *,
    threads: int | None = None,
    optimization: str = "all",
    providers: Sequence[Any] = ("CPUExecutionProvider",),
    config: dict[str, str] | None = None,
    profile_prefix: str | None = None,
):
    """An ``onnxruntime.InferenceSession`` over ``model`` (a path, serialized
    bytes or an ``onnx.ModelProto``); ``config`` are session config entries;
    ``profile_prefix``: turn on onnxruntime's profiler, writing its JSON there
    (``session.end_profiling()`` returns the file)."""
    import onnxruntime as ort

    if optimization not in OPTIMIZATION_LEVELS:
        raise StatusError(Status.BAD_ARGUMENT, f"onnxruntime: optimization {optimization!r} unknown (known: {', '.join(OPTIMIZATION_LEVELS)})")
    opts = ort.SessionOptions()
    if threads is not None:
        opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    if profile_prefix is not None:
        opts.enable_profiling, opts.profile_file_prefix = True, profile_prefix
    for key, value in (config or {}).items():
        opts.add_session_config_entry(key, value)
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    return ort.InferenceSession(model, opts, providers=list(providers))


def providers_for(wanted: Sequence[Any]) -> list[Any]:
    """``wanted`` if this onnxruntime has its first provider, else an ``UNSUPPORTED``
    StatusError naming what it has (a GPU provider needs onnxruntime-gpu)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    first = wanted[0] if isinstance(wanted[0], str) else wanted[0][0]
    if first not in available:
        raise StatusError(
            Status.UNSUPPORTED,
            f"onnxruntime here has no {first} (available: {', '.join(available)}; install onnxruntime-gpu)",
        )
    return list(wanted)

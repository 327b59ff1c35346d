"""onnxruntime sessions, set up one way everywhere.

Every session sf_trt opens (the decoder, the verify-and-sample graphs, the copy
model, the TensorRT stand-in) comes from :func:`open_session`: sequential
execution, one inter-op thread, ``threads`` intra-op threads (None: one per
core) and a graph optimization level by name. :func:`providers_for` checks
that the execution providers asked for exist in this onnxruntime.

A session is created with glibc's heap kept off the weights (:func:`weights_off_heap`):
loading a model, onnxruntime reads each initializer, rewrites it (DequantizeLinear ->
MatMul into its n-bit matmul) and prepacks it, freeing the earlier forms as it goes. glibc
raises its mmap threshold to the size of each large block freed, up to 32 MiB, so the later
blocks (a 1.1B model's are 4-23 MiB) land in the brk heap, and the ones freed there stay
resident between live ones. At 1.1B int8 that held about 0.45 GB: ``sf-trt generate``'s
peak RSS was 1.6x its weights' bytes, 1.2x with this (docs/benchmarks.md, "Peak memory").
``SF_TRT_WEIGHTS_OFF_HEAP=0`` in the environment leaves glibc's own behaviour.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from typing import Any, Iterator, Sequence

from ..abi import Status, StatusError

__all__ = ["OPTIMIZATION_LEVELS", "open_session", "providers_for", "weights_off_heap"]

OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")

LOAD_MMAP_THRESHOLD = 128 << 10
"""glibc's mmap threshold while a session loads, its own initial one held fixed: every block
of 128 KiB or more gets its own mapping, returned to the system when freed (at 1 MiB the
135M model's smaller matrices still left 25 MB of freed blocks in the heap)."""
RUN_MMAP_THRESHOLD = 32 << 20
"""... and after: glibc's own ceiling for the threshold it raises by itself (64-bit), with
the heap trimmed past twice that, as glibc sets it when it raises the threshold: the
passes' transient buffers (logits, new keys and values) reuse heap memory as under glibc's
default, without a mapping and its page faults per pass."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_loading = 0  # sessions loading now, across threads
_loading_lock = threading.Lock()


def _mallopt(param: int, value: int) -> bool:
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(param, value))
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return False


@contextlib.contextmanager
def weights_off_heap() -> Iterator[None]:
    """Within it, glibc maps blocks of :data:`LOAD_MMAP_THRESHOLD` and more on their own;
    when the last loader in the process leaves, the threshold is set to
    :data:`RUN_MMAP_THRESHOLD`. It does nothing where ``SF_TRT_WEIGHTS_OFF_HEAP`` is ``0``,
    where ``MALLOC_MMAP_THRESHOLD_`` is set (glibc follows that) and elsewhere than glibc."""
    global _loading
    if os.environ.get("SF_TRT_WEIGHTS_OFF_HEAP") == "0" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        yield
        return
    with _loading_lock:
        _loading += 1
        if _loading == 1:
            _mallopt(_M_MMAP_THRESHOLD, LOAD_MMAP_THRESHOLD)
    try:
        yield
    finally:
        with _loading_lock:
            _loading -= 1
            if _loading == 0 and _mallopt(_M_MMAP_THRESHOLD, RUN_MMAP_THRESHOLD):
                _mallopt(_M_TRIM_THRESHOLD, 2 * RUN_MMAP_THRESHOLD)


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
    with weights_off_heap():
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

"""Engine runners: one engine, its execution context, its output buffers.

:class:`TrtRunner` runs a deserialized TensorRT engine (optionally replaying a
CUDA graph); :class:`OrtRunner` runs the engine's own ONNX graph on onnxruntime,
the CPU stand-in the tests use. Both take exactly the engine's one shape.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from .buffers import BufferPlan
from .device import TorchDevice
from .errors import TensorRTError, refuse
from .probes import trt_dtype_name

__all__ = ["EngineRunner", "OrtRunner", "TrtRunner", "CaptureRefused", "capture_or_none"]


class EngineRunner(Protocol):
    """Runs one engine at its one shape: ``bind`` fixes a persistent input (a state
    buffer whose address never changes), ``run`` feeds the per-run inputs and
    returns the outputs, valid until the next ``run``."""

    name: str
    plan: BufferPlan
    graph_captured: bool
    """Whether runs replay a captured CUDA graph."""

    def bind(self, name: str, buf: Any) -> None: ...
    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]: ...
    def close(self) -> None: ...


class OrtRunner:
    """The CPU stand-in: the engine's own ONNX graph on onnxruntime (tests only)."""

    graph_captured = False  # no CUDA graphs on the CPU

    def __init__(self, name: str, graph: Any, plan: BufferPlan, threads: int = 1) -> None:
        from ..ort_session import open_session  # noqa: PLC0415

        self.session = open_session(graph if hasattr(graph, "SerializeToString") else os.fspath(graph), threads=threads)
        self.name, self.plan = name, plan
        self._bound: dict[str, Any] = {}
        self._outputs = [b.name for b in plan.outputs()]
        self._shapes = {b.name: b.shape for b in plan.inputs()}

    def bind(self, name: str, buf: Any) -> None:
        self._bound[name] = buf

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        feeds = {**self._bound, **feeds}
        wrong = {n: tuple(a.shape) for n, a in feeds.items() if tuple(a.shape) != self._shapes[n]}
        if wrong:  # what an engine of one shape would refuse
            raise TensorRTError(f"{self.name}: inputs {wrong} do not have the engine's one shape {[self._shapes[n] for n in wrong]}")
        values = self.session.run(self._outputs, feeds)
        return dict(zip(self._outputs, values))

    def close(self) -> None:
        self.session = None


class CaptureRefused(Exception):
    """A CUDA graph capture TensorRT or CUDA would not complete."""


def capture_or_none(name: str, capture: Callable[[], Any], warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> Any:
    """``capture()``, or ``None`` after one warning line when it raises :class:`CaptureRefused`:
    the caller then enqueues plainly, as trtexec does when a capture fails."""
    try:
        return capture()
    except CaptureRefused as exc:
        warn(f"sf_trt: warning: {name}: CUDA graph capture failed ({exc}); running without CUDA graphs")
        return None


class TrtRunner:
    """One deserialized TensorRT engine, its execution context and output buffers.

    Output buffers are allocated once at the engine's one shape; each run hands out
    views of them. With ``cuda_graphs``, the first run is captured into a CUDA graph
    (on its own execution context, with static input buffers) and every later run
    replays it; a capture TensorRT or CUDA refuses ends, leaves one warning line, and
    the runner enqueues plainly from then on. Every call into TensorRT runs with the
    runner's device current; a ``False`` it returns, or a ``RuntimeError`` it raises,
    becomes a :class:`TensorRTError` naming the engine, the call and the tensor.
    """

    def __init__(self, trt, runtime, name: str, engine_bytes: bytes, plan: BufferPlan, dev: TorchDevice, *, cuda_graphs: bool = False) -> None:
        self.trt, self.name, self.plan, self.dev = trt, name, plan, dev
        with dev.current():
            self.engine = self._call(lambda: runtime.deserialize_cuda_engine(engine_bytes), "deserialize_cuda_engine")
            if self.engine is None:
                raise TensorRTError(f"{name}: deserialize_cuda_engine returned None (see TensorRT's log)")
            engine_io = []
            for i in range(self.engine.num_io_tensors):
                tname = self.engine.get_tensor_name(i)
                mode = "input" if self.engine.get_tensor_mode(tname) == trt.TensorIOMode.INPUT else "output"
                engine_io.append((tname, mode, trt_dtype_name(trt, self.engine.get_tensor_dtype(tname))))
            problems = plan.problems_with(engine_io)
            if problems:
                raise refuse(f"engine {name!r} does not match its manifest: " + "; ".join(problems))
            self.context = self._new_context()
            self._outputs = {b.name: dev.zeros(b.shape, b.dtype) for b in plan.outputs()}
        self._bound: dict[str, Any] = {}
        self.cuda_graphs = cuda_graphs
        self._graph: tuple[Any, Any, dict, dict] | None = None
        self._capture_tried = False

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        try:
            return fn()
        except RuntimeError as exc:
            raise TensorRTError(f"{self.name}: {what} raised: {exc}") from None

    def _new_context(self):
        ctx = self._call(self.engine.create_execution_context, "create_execution_context")
        if ctx is None:
            raise TensorRTError(f"{self.name}: create_execution_context returned None (out of device memory?)")
        return ctx

    def _ok(self, result: bool, call: str) -> None:
        if not result:
            raise TensorRTError(f"{self.name}: {call} returned False (see TensorRT's log)")

    def bind(self, name: str, buf: Any) -> None:
        self._bound[name] = buf

    def _prepare(self, ctx, feeds: Mapping[str, Any], outputs: dict[str, Any]) -> dict[str, Any]:
        """Shapes and addresses for one run on ``ctx``; returns the output views."""
        for name, t in {**self._bound, **feeds}.items():
            shape = tuple(t.shape)
            self._ok(self._call(lambda: ctx.set_input_shape(name, shape), f"set_input_shape({name!r}, {shape})"), f"set_input_shape({name!r}, {shape})")
            self._ok(self._call(lambda: ctx.set_tensor_address(name, t.data_ptr()), f"set_tensor_address({name!r})"), f"set_tensor_address({name!r})")
        unresolved = self._call(ctx.infer_shapes, "infer_shapes (from the input shapes " + ", ".join(f"{n} {tuple(t.shape)}" for n, t in feeds.items()) + ")")
        if unresolved:
            raise TensorRTError(f"{self.name}: shapes of {list(unresolved)} cannot be inferred from the inputs")
        views = {}
        for name, buf in outputs.items():
            shape = tuple(ctx.get_tensor_shape(name))
            view = buf.view(-1)[: int(np.prod(shape, dtype=np.int64))].view(shape)
            self._ok(self._call(lambda: ctx.set_tensor_address(name, view.data_ptr()), f"set_tensor_address({name!r})"), f"set_tensor_address({name!r})")
            views[name] = view
        return views

    def _enqueue(self, ctx, what: str) -> None:
        self._ok(self._call(lambda: ctx.execute_async_v3(self.dev.stream.cuda_stream), what), what)

    @property
    def graph_captured(self) -> bool:
        """Whether runs replay a captured CUDA graph (False before the first run, without
        ``cuda_graphs``, and after a refused capture fell back to plain enqueues)."""
        return self._graph is not None

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        with self.dev.current(), self.dev.on_stream():
            if self.cuda_graphs and not self._capture_tried:
                self._capture_tried = True
                self._graph = capture_or_none(self.name, lambda: self._capture(feeds))
            if self._graph is not None:
                graph, _, static_in, views = self._graph
                for name, t in feeds.items():
                    static_in[name].copy_(t, non_blocking=True)
                graph.replay()
                return views
            views = self._prepare(self.context, feeds, self._outputs)
            self._enqueue(self.context, "execute_async_v3")
            return views

    def _capture(self, feeds: Mapping[str, Any]) -> tuple[Any, Any, dict, dict]:
        """A CUDA graph of one run at the engine's shape; :class:`CaptureRefused` when TensorRT's
        enqueue or CUDA refuses the capture (the capture is ended and the CUDA error cleared)."""
        torch, stream = self.dev.torch, self.dev.stream
        ctx = self._new_context()  # a graph fixes its context's shapes and addresses: one context for the graph
        static_in = {n: t.clone() for n, t in feeds.items()}  # on the stream: run() entered it
        outputs = {b.name: self.dev.zeros(b.shape, b.dtype) for b in self.plan.outputs()}
        views = self._prepare(ctx, static_in, outputs)
        # TensorRT defers some work after a shape change to the first enqueue:
        # run once outside the capture so the graph holds only the kernels.
        self._enqueue(ctx, "execute_async_v3 (before capture)")
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=stream):
                ok = ctx.execute_async_v3(stream.cuda_stream)
        except RuntimeError as exc:  # torch ends an invalidated capture by raising
            self.dev.clear_error()
            raise CaptureRefused(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        if not ok:  # enqueue refused inside the capture (an op not allowed while capturing)
            self.dev.clear_error()
            raise CaptureRefused("execute_async_v3 returned False while capturing")
        return graph, ctx, static_in, views

    def close(self) -> None:
        self._graph = None
        self._outputs.clear()
        self._bound.clear()
        self.context = None
        self.engine = None

"""Engine runners: one engine, its execution context, its output buffers.

:class:`TrtRunner` runs a deserialized TensorRT engine (optionally replaying
CUDA graphs); :class:`OrtRunner` runs the engine's own ONNX graph on
onnxruntime, the CPU stand-in the tests use.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Protocol

import numpy as np

from .buffers import BufferPlan
from .device import TorchDevice
from .errors import TensorRTError, refuse
from .probes import trt_dtype_name

__all__ = ["EngineRunner", "OrtRunner", "TrtRunner"]


class EngineRunner(Protocol):
    """Runs one engine: ``bind`` fixes a persistent input (a state buffer whose
    address never changes), ``run`` feeds the per-pass inputs and returns the
    outputs, valid until the next ``run``. ``capturable`` marks a plain decode
    step, whose shape repeats: a runner may replay it from a CUDA graph."""

    name: str
    plan: BufferPlan

    def bind(self, name: str, buf: Any) -> None: ...
    def run(self, feeds: Mapping[str, Any], capturable: bool = False) -> dict[str, Any]: ...
    def close(self) -> None: ...


class OrtRunner:
    """The CPU stand-in: the engine's own ONNX graph on onnxruntime (tests only)."""

    def __init__(self, name: str, graph: Any, plan: BufferPlan, threads: int = 1) -> None:
        from ..ort_session import open_session  # noqa: PLC0415

        self.session = open_session(graph if hasattr(graph, "SerializeToString") else os.fspath(graph), threads=threads)
        self.name, self.plan = name, plan
        self._bound: dict[str, Any] = {}
        self._outputs = [b.name for b in plan.outputs()]

    def bind(self, name: str, buf: Any) -> None:
        self._bound[name] = buf

    def run(self, feeds: Mapping[str, Any], capturable: bool = False) -> dict[str, Any]:
        values = self.session.run(self._outputs, {**self._bound, **feeds})
        return dict(zip(self._outputs, values))

    def close(self) -> None:
        self.session = None


class TrtRunner:
    """One deserialized TensorRT engine, its execution context and output buffers.

    Output buffers are allocated once at the plan's max shapes; each run hands
    out views of the shapes TensorRT infers. With ``cuda_graphs``, a
    ``capturable`` run is captured once per input-shape key into a CUDA graph
    (on its own execution context, with static input buffers) and replayed
    after; at most ``graph_limit`` keys are captured.
    """

    def __init__(
        self, trt, runtime, name: str, engine_bytes: bytes, plan: BufferPlan, dev: TorchDevice,
        *, cuda_graphs: bool = False, graph_limit: int = 8,
    ) -> None:
        self.trt, self.name, self.plan, self.dev = trt, name, plan, dev
        self.engine = runtime.deserialize_cuda_engine(engine_bytes)
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
        self.cuda_graphs, self.graph_limit = cuda_graphs, graph_limit
        self._graphs: dict[tuple, tuple[Any, Any, dict, dict]] = {}

    def _new_context(self):
        ctx = self.engine.create_execution_context()
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
            self._ok(ctx.set_input_shape(name, tuple(t.shape)), f"set_input_shape({name!r}, {tuple(t.shape)})")
            self._ok(ctx.set_tensor_address(name, t.data_ptr()), f"set_tensor_address({name!r})")
        unresolved = ctx.infer_shapes()
        if unresolved:
            raise TensorRTError(f"{self.name}: shapes of {list(unresolved)} cannot be inferred from the inputs")
        views = {}
        for name, buf in outputs.items():
            shape = tuple(ctx.get_tensor_shape(name))
            view = buf.view(-1)[: int(np.prod(shape, dtype=np.int64))].view(shape)
            self._ok(ctx.set_tensor_address(name, view.data_ptr()), f"set_tensor_address({name!r})")
            views[name] = view
        return views

    def run(self, feeds: Mapping[str, Any], capturable: bool = False) -> dict[str, Any]:
        key = tuple((n, tuple(t.shape)) for n, t in sorted(feeds.items()))
        if self.cuda_graphs and capturable and key not in self._graphs and len(self._graphs) < self.graph_limit:
            self._capture(key, feeds)
        if key in self._graphs:
            graph, _, static_in, views = self._graphs[key]
            with self.dev.torch.cuda.stream(self.dev.stream):
                for name, t in feeds.items():
                    static_in[name].copy_(t, non_blocking=True)
                graph.replay()
            return views
        views = self._prepare(self.context, feeds, self._outputs)
        self._ok(self.context.execute_async_v3(self.dev.stream.cuda_stream), "execute_async_v3")
        return views

    def _capture(self, key: tuple, feeds: Mapping[str, Any]) -> None:
        torch = self.dev.torch
        ctx = self._new_context()  # a graph fixes its context's shapes and addresses: one context per graph
        with torch.cuda.stream(self.dev.stream):
            static_in = {n: t.clone() for n, t in feeds.items()}
        outputs = {b.name: self.dev.zeros(b.shape, b.dtype) for b in self.plan.outputs()}
        views = self._prepare(ctx, static_in, outputs)
        # TensorRT defers some work after a shape change to the first enqueue:
        # run once outside the capture so the graph holds only the kernels.
        self._ok(ctx.execute_async_v3(self.dev.stream.cuda_stream), "execute_async_v3 (before capture)")
        self.dev.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.dev.stream):
            self._ok(ctx.execute_async_v3(self.dev.stream.cuda_stream), "execute_async_v3 (capture)")
        self._graphs[key] = (graph, ctx, static_in, views)

    def close(self) -> None:
        self._graphs.clear()
        self._outputs.clear()
        self._bound.clear()
        self.context = None
        self.engine = None

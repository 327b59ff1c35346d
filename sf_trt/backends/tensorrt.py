"""TensorRT primitives: the engines ``sf-trt build`` writes, behind the Primitives protocol.

:meth:`TensorRTPrimitives.open` reads ``engines/manifest.json``, refuses an
engine built by another TensorRT version or for another GPU (or whose bytes
changed), deserializes it, and keeps every buffer on the device: the model's
state (the fake's token history; a decoder's KV cache), the rows of a pass, the
logits, the drawn tokens. Each pass is ``set_input_shape`` / ``set_tensor_address``
/ ``execute_async_v3`` on one CUDA stream, every boolean result checked; decode
steps can be captured into CUDA graphs and replayed.

Rollback is a length, as on every backend: ``truncate`` moves the lane's state
length back (``PrimitivesBase`` keeps it) and nothing is copied; positions past
it are never read by the graphs and are overwritten by the next pass::

    lane state  [0 .......... committed) [committed ... draft end)
                 kept, read by attention   rejected: dead, rewritten next pass

Only this module imports ``tensorrt`` and ``torch`` (for device buffers), and
only inside :meth:`TensorRTPrimitives.open`: importing it needs neither.
:class:`BufferPlan` (what to allocate, from a graph or a manifest) and the whole
pass logic run on the CPU too, with onnxruntime standing in for the engines
(:meth:`TensorRTPrimitives.stand_in`), which is how they are tested without a GPU.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

import numpy as np

from ..abi import Status, StatusError
from ..export.verify import SAMPLE_INPUTS as VERIFY_SAMPLE_INPUTS
from ..export.verify import sample_feeds
from ..primitives import Capabilities, PrimitivesBase, Rows, SampleRows

__all__ = ["BufferSpec", "BufferPlan", "EngineRunner", "TensorRTError", "TensorRTPrimitives"]

_ITEMSIZE = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1,
}

VERIFY_LOGITS = "logits"
"""The verify graph's logits input; its other inputs are what ``sample_feeds`` makes of a
:class:`SampleRows` (sf_trt.export.verify: the fields, and the noise keys)."""
VERIFY_TOKENS, VERIFY_MATCH = "tokens", "match"
"""The verify graph's outputs: drawn tokens ``[K]`` and ``tokens == draft`` ``[K]``."""
COPY_STATE = "history"
"""The copy model's state input: each lane's tokens by position, ``[max_lanes, max_context]``."""


class TensorRTError(RuntimeError):
    """TensorRT or CUDA failed while running (a call returned False, an engine
    would not deserialize). Not a refusal of input: those are StatusErrors,
    raised before anything runs."""


def _refuse(what: str) -> StatusError:
    return StatusError(Status.UNSUPPORTED, f"TensorRTPrimitives: {what}")


# -- buffer plans ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BufferSpec:
    """One device buffer: an engine tensor at its largest profile shape."""

    name: str
    mode: str  # "input" | "output"
    dtype: str  # numpy name; "bfloat16" for BF16
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _ITEMSIZE[self.dtype]


@dataclasses.dataclass(frozen=True)
class BufferPlan:
    """Every I/O buffer one engine needs, sized at the maximum of its profile.

    Built from the ONNX graph alone (:meth:`from_onnx`) or from a manifest
    entry (:meth:`from_manifest`); the same plan allocates the device buffers
    and is checked against the deserialized engine's own I/O.
    """

    engine: str
    buffers: tuple[BufferSpec, ...]
    dims: Mapping[str, int]
    """The max of each named dynamic dim (e.g. ``{"rows": 256}``)."""

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def __getitem__(self, name: str) -> BufferSpec:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"BufferPlan({self.engine}): no tensor {name!r} (has: {[b.name for b in self.buffers]})")

    def __contains__(self, name: str) -> bool:
        return any(b.name == name for b in self.buffers)

    def inputs(self) -> list[BufferSpec]:
        return [b for b in self.buffers if b.mode == "input"]

    def outputs(self) -> list[BufferSpec]:
        return [b for b in self.buffers if b.mode == "output"]

    @staticmethod
    def from_io(engine: str, io: Iterable[Any], dims: Mapping[str, int]) -> "BufferPlan":
        """From I/O tensors with symbolic shapes (``IOTensor``s) and the max of each dim name."""
        specs = []
        for t in io:
            shape = []
            for k, d in enumerate(t.shape):
                if isinstance(d, str):
                    if d not in dims:
                        raise _refuse(
                            f"{engine}: {t.mode} {t.name!r} dim {k} is named {d!r}, which no input's profile bounds "
                            f"(bounded: {sorted(dims)})"
                        )
                    shape.append(int(dims[d]))
                elif int(d) < 0:
                    raise _refuse(f"{engine}: {t.mode} {t.name!r} dim {k} is dynamic without a name")
                else:
                    shape.append(int(d))
            if t.dtype not in _ITEMSIZE:
                raise _refuse(f"{engine}: {t.mode} {t.name!r} has dtype {t.dtype}; expected one of {sorted(_ITEMSIZE)}")
            specs.append(BufferSpec(t.name, t.mode, t.dtype, tuple(shape)))
        return BufferPlan(engine, tuple(specs), dict(dims))

    @staticmethod
    def from_onnx(graph: Any, cfg: Any = None, *, name: str | None = None, dims: Mapping[str, int] | None = None) -> "BufferPlan":
        """From an ONNX graph (a ``ModelProto`` or a path) and the
        :class:`~export.trt_build.BuildConfig` its engine is (to be) built with."""
        from sf_trt.export.trt_build import BuildConfig, derive_profiles, onnx_io

        if dims is None:
            dims = derive_profiles(graph, cfg or BuildConfig()).max_dims()
        if name is None:
            name = Path(os.fspath(graph)).stem if isinstance(graph, (str, os.PathLike)) else (graph.graph.name or "graph")
        return BufferPlan.from_io(name, onnx_io(graph), dims)

    @staticmethod
    def from_manifest(entry: Any) -> "BufferPlan":
        """From an :class:`~export.trt_build.EngineManifest` entry (its first profile)."""
        dims = {k: v[2] for k, v in entry.profiles[0].dims.items()} if entry.profiles else {}
        return BufferPlan.from_io(entry.name, entry.io, dims)

    def problems_with(self, engine_io: Iterable[tuple[str, str, str]]) -> list[str]:
        """How an engine's ``(name, mode, dtype)`` I/O differs from this plan."""
        have = {n: (m, d) for n, m, d in engine_io}
        want = {b.name: (b.mode, b.dtype) for b in self.buffers}
        out = [f"engine lacks {m} {n!r}" for n, (m, _) in want.items() if n not in have]
        out += [f"engine has unplanned {m} {n!r}" for n, (m, _) in have.items() if n not in want]
        out += [
            f"{n!r} is {have[n][0]} {have[n][1]} in the engine, {want[n][0]} {want[n][1]} in the plan"
            for n in want
            if n in have and have[n] != want[n]
        ]
        return out

    def describe(self) -> str:
        rows = [f"{b.mode:6} {b.name:24} {b.dtype:9} {str(list(b.shape)):20} {b.nbytes:>12,} B" for b in self.buffers]
        return "\n".join([f"{self.engine}: {self.total_bytes:,} bytes at max profile {dict(self.dims)}", *rows])


# -- where the arrays live -------------------------------------------------------------


class _Device(Protocol):
    """Arrays of one place: numpy on the CPU (stand-in) or torch on a CUDA device."""

    def to_device(self, a: np.ndarray) -> Any: ...
    def to_host(self, x: Any) -> np.ndarray: ...
    def zeros(self, shape: Sequence[int], dtype: str) -> Any: ...
    def put(self, buf: Any, index: tuple, values: Any) -> None: ...
    def synchronize(self) -> None: ...


class _NumpyDevice:
    def to_device(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a)

    def to_host(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def zeros(self, shape: Sequence[int], dtype: str) -> np.ndarray:
        return np.zeros(tuple(shape), np.dtype(_numpy_dtype(dtype)))

    def put(self, buf: np.ndarray, index: tuple, values: np.ndarray) -> None:
        buf[index] = values

    def synchronize(self) -> None:
        pass


def _numpy_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes  # noqa: PLC0415 (numpy has no bfloat16 of its own)

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


class _TorchDevice:
    """torch tensors on one CUDA device; all work on one stream."""

    def __init__(self, torch, device: int) -> None:
        self.torch = torch
        self.device = torch.device("cuda", device)
        self.stream = torch.cuda.Stream(self.device)
        self.dtypes = {
            "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
        }

    def to_device(self, a: np.ndarray):
        with self.torch.cuda.stream(self.stream):
            return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.device, non_blocking=False)

    def to_host(self, x) -> np.ndarray:
        self.stream.synchronize()
        if x.dtype == self.torch.bfloat16:
            x = x.float()
        return x.cpu().numpy()

    def zeros(self, shape, dtype: str):
        with self.torch.cuda.stream(self.stream):
            return self.torch.zeros(tuple(shape), dtype=self.dtypes[dtype], device=self.device)

    def put(self, buf, index: tuple, values) -> None:
        with self.torch.cuda.stream(self.stream):
            buf[index] = values

    def synchronize(self) -> None:
        self.stream.synchronize()


# -- engine runners ---------------------------------------------------------------------


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


class _OrtRunner:
    """The CPU stand-in: the engine's own ONNX graph on onnxruntime (tests only)."""

    def __init__(self, name: str, graph: Any, plan: BufferPlan, threads: int = 1) -> None:
        import onnx  # noqa: PLC0415
        import onnxruntime as ort  # noqa: PLC0415

        model = graph if isinstance(graph, onnx.ModelProto) else onnx.load(os.fspath(graph))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
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


class _TrtRunner:
    """One deserialized TensorRT engine, its execution context and output buffers.

    Output buffers are allocated once at the plan's max shapes; each run hands
    out views of the shapes TensorRT infers. With ``cuda_graphs``, a
    ``capturable`` run is captured once per input-shape key into a CUDA graph
    (on its own execution context, with static input buffers) and replayed
    after; at most ``graph_limit`` keys are captured.
    """

    def __init__(
        self, trt, runtime, name: str, engine_bytes: bytes, plan: BufferPlan, dev: _TorchDevice,
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
            from sf_trt.export.trt_build import trt_dtype_name  # noqa: PLC0415

            engine_io.append((tname, mode, trt_dtype_name(trt, self.engine.get_tensor_dtype(tname))))
        problems = plan.problems_with(engine_io)
        if problems:
            raise _refuse(f"engine {name!r} does not match its manifest: " + "; ".join(problems))
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


# -- the primitives ------------------------------------------------------------------------


class _CopyModel:
    """The fake's copy model: the state is each lane's tokens by position.

    Inputs ``history [max_lanes, max_context]`` (bound: the state) and the
    logit rows' ``lanes`` / ``positions`` ``[rows]``; output ``logits``.
    """

    def __init__(self, runner: EngineRunner, dev: _Device) -> None:
        plan = runner.plan
        state = plan[COPY_STATE]
        logits = plan.outputs()[0]
        if len(state.shape) != 2 or len(logits.shape) != 2:
            raise _refuse(f"model engine {runner.name!r}: expected {COPY_STATE} [lanes, context] and logits [rows, vocab]")
        self.runner, self.dev = runner, dev
        self.max_lanes, self.max_context = state.shape
        self.vocab = logits.shape[1]
        self.row_inputs = [b for b in plan.inputs() if b.name != COPY_STATE]
        missing = [b.name for b in self.row_inputs if b.name not in ("lanes", "positions")]
        if missing:
            raise _refuse(f"copy-model engine {runner.name!r} has inputs {missing}; expected only history, lanes, positions")
        self.max_rows = min(b.shape[0] for b in self.row_inputs)
        self.logits_name = logits.name
        self.state = dev.zeros(state.shape, state.dtype)
        self.state_dtype = state.dtype
        runner.bind(COPY_STATE, self.state)

    def forward(self, rows: Rows, vocab: int) -> Any:
        dev = self.dev
        dev.put(
            self.state, (dev.to_device(rows.lanes), dev.to_device(rows.positions)),
            dev.to_device(rows.tokens.astype(_numpy_dtype(self.state_dtype))),
        )
        k = int(rows.logit_rows.size)
        if k == 0:
            return dev.zeros((0, vocab), "float32")
        pick = rows.logit_rows
        feeds = {b.name: dev.to_device(getattr(rows, b.name)[pick].astype(_numpy_dtype(b.dtype))) for b in self.row_inputs}
        return self.runner.run(feeds, capturable=k <= self.max_lanes)[self.logits_name]

    def close(self) -> None:
        self.state = None


DECODER_INPUTS = ("input_ids", "positions", "lane_ids", "logit_index")
"""The decoder graph's per-pass inputs (export/decoder.py); its state is ``past_key_i`` / ``past_value_i``."""


class _Decoder:
    """A Llama decoder (export/decoder.py): the state is each layer's KV cache.

    A pass packs its rows as ``[B lanes, T rows]`` (lanes in order of first
    appearance, short lanes padded with the trash position ``max_context``),
    asks for the logit rows by flat index ``b * T + t``, and gets this pass's
    K/V back as ``new_kv [layers, 2, B, T, kv_heads, head_dim]``; the real rows'
    K/V are then written into the caches at ``(lane, :, position, :)`` on the
    device. Rolled-back positions are masked by the graph (keys ``j <= p`` only)
    and overwritten by the next pass there.
    """

    def __init__(self, runner: EngineRunner, dev: _Device) -> None:
        plan = runner.plan
        self.runner, self.dev = runner, dev
        self.caches = []  # (key buffer name, value buffer name) per layer
        i = 0
        while f"past_key_{i}" in plan and f"past_value_{i}" in plan:
            self.caches.append((f"past_key_{i}", f"past_value_{i}"))
            i += 1
        if not self.caches:
            raise _refuse(f"decoder engine {runner.name!r} has no past_key_0 / past_value_0 inputs")
        cache = plan["past_key_0"]
        if len(cache.shape) != 4:
            raise _refuse(f"decoder engine {runner.name!r}: past_key_0 shape {cache.shape}, expected [lanes, kv_heads, context + 1, head_dim]")
        self.max_lanes, _, cache_len, _ = cache.shape
        self.max_context = cache_len - 1  # the last slot takes padding rows' K/V
        self.vocab = plan["logits"].shape[1]
        batch_max, rows_max, logit_max = plan["lane_ids"].shape[0], plan["input_ids"].shape[1], plan["logit_index"].shape[0]
        if batch_max < self.max_lanes:
            raise _refuse(
                f"decoder engine {runner.name!r}: its profile takes {batch_max} lanes a pass, its cache holds "
                f"{self.max_lanes}; rebuild it with --max-lanes {self.max_lanes}"
            )
        self.max_rows = min(rows_max, logit_max)
        self.bufs = {}
        for pair in self.caches:
            for name in pair:
                b = plan[name]
                self.bufs[name] = dev.zeros(b.shape, b.dtype)
                runner.bind(name, self.bufs[name])
        self.dtypes = {name: _numpy_dtype(plan[name].dtype) for name in DECODER_INPUTS}

    def forward(self, rows: Rows, vocab: int) -> Any:
        dev, n = self.dev, rows.num_rows
        if n == 0:
            return dev.zeros((0, vocab), "float32")
        # Pack: lane b of the pass in order of first appearance, row t within it.
        order, b_of = [], {}
        for lane in rows.lanes.tolist():
            if lane not in b_of:
                b_of[lane] = len(order)
                order.append(lane)
        b_idx = np.array([b_of[lane] for lane in rows.lanes.tolist()], np.int64)
        first = np.full(self.max_lanes, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, rows.lanes, rows.positions)
        t_idx = rows.positions - first[rows.lanes]  # a lane's rows are consecutive positions
        n_lanes, t_len = len(order), int(t_idx.max()) + 1
        input_ids = np.zeros((n_lanes, t_len), np.int64)
        positions = np.full((n_lanes, t_len), self.max_context, np.int64)  # padding: the trash slot
        input_ids[b_idx, t_idx] = rows.tokens
        positions[b_idx, t_idx] = rows.positions
        k = int(rows.logit_rows.size)
        # A pass with no logit rows still writes K/V: ask for row 0 and drop it.
        logit_index = (b_idx * t_len + t_idx)[rows.logit_rows] if k else np.zeros(1, np.int64)
        host = {"input_ids": input_ids, "positions": positions, "lane_ids": np.array(order, np.int64), "logit_index": logit_index}
        feeds = {name: dev.to_device(a.astype(self.dtypes[name])) for name, a in host.items()}
        out = self.runner.run(feeds, capturable=t_len == 1)
        new_kv = out["new_kv"]  # [layers, 2, B, T, kv_heads, head_dim]
        at = (dev.to_device(rows.lanes), slice(None), dev.to_device(rows.positions), slice(None))
        rows_bt = (dev.to_device(b_idx), dev.to_device(t_idx))
        for layer, (key_name, value_name) in enumerate(self.caches):
            dev.put(self.bufs[key_name], at, new_kv[layer, 0][rows_bt])
            dev.put(self.bufs[value_name], at, new_kv[layer, 1][rows_bt])
        return out["logits"] if k else dev.zeros((0, vocab), "float32")

    def close(self) -> None:
        self.bufs.clear()


class TensorRTPrimitives(PrimitivesBase):
    """The copy model (the TensorRT fake) or a decoder, and the verify-and-sample
    graph, as engines behind the Primitives protocol.

    Construct with :meth:`open` (TensorRT engines from a manifest directory),
    :meth:`fake` (the copy model for a :class:`~sf_trt.fake.FakeConfig`) or
    :meth:`stand_in` (the same graphs on onnxruntime, CPU; for tests). The
    model engine is told apart by its inputs: ``history`` (the copy model's
    token state) or ``past_key_0`` ... (a decoder's KV cache).

    Capabilities come from the engines: ``vocab`` from the logits, ``max_lanes``
    and ``max_context`` from the state buffers, ``max_rows_per_pass`` from the
    profile; ``eos`` and ``top_k_limit`` from the caller or the manifest's meta.
    """

    def __init__(
        self,
        model: EngineRunner,
        verify: EngineRunner,
        device: _Device,
        *,
        eos: int,
        verify_rows: bool = True,
        truncate_partial: bool = True,
        kernel_capabilities: int = 0,
        top_k_limit: int | None = None,
        max_rows_per_pass: int | None = None,
    ) -> None:
        self._verify, self._dev = verify, device
        names = [b.name for b in model.plan.inputs()]
        if COPY_STATE in model.plan:
            self._model: _CopyModel | _Decoder | None = _CopyModel(model, device)
        elif all(n in model.plan for n in DECODER_INPUTS):
            self._model = _Decoder(model, device)
        else:
            raise _refuse(
                f"model engine {model.name!r} is neither the copy model ({COPY_STATE!r} input) nor a decoder "
                f"({', '.join(DECODER_INPUTS)}); its inputs: {names}"
            )
        m = self._model
        _check_verify_plan(verify.plan, m.vocab)
        if top_k_limit is None:
            raise _refuse(f"top_k_limit not given (the largest top_k verify engine {verify.name!r} was built for)")
        if max_rows_per_pass is not None and max_rows_per_pass > m.max_rows:
            raise _refuse(f"max_rows_per_pass {max_rows_per_pass} exceeds the engine's profile ({m.max_rows} rows)")
        verify_max = verify.plan[VERIFY_LOGITS].shape[0]
        super().__init__(
            Capabilities(
                vocab=int(m.vocab), eos=int(eos), max_lanes=int(m.max_lanes), max_context=int(m.max_context),
                max_rows_per_pass=int(min(max_rows_per_pass or m.max_rows, verify_max)), verify_rows=verify_rows,
                truncate_partial=truncate_partial, kernel_capabilities=kernel_capabilities, top_k_limit=int(top_k_limit),
            )
        )

    # -- constructors ----------------------------------------------------------------

    @classmethod
    def open(
        cls,
        engine_dir: str | os.PathLike = "engines",
        *,
        model: str = "copy_model",
        verify: str = "verify",
        eos: int | None = None,
        device: int = 0,
        cuda_graphs: bool = False,
        cuda_graph_limit: int = 8,
        **caps: Any,
    ) -> "TensorRTPrimitives":
        """Load engines ``model`` and ``verify`` from ``engine_dir`` after
        checking their manifest entries against this TensorRT and GPU.

        ``eos`` defaults to the manifest's ``meta["eos"]``; ``caps`` go to the
        constructor (``verify_rows``, ``truncate_partial``, ``top_k_limit``, ...).
        """
        from sf_trt.export.trt_build import BuildError, check_manifest, device_info, import_tensorrt, read_manifest

        try:
            trt = import_tensorrt()
        except BuildError as exc:
            raise _refuse(str(exc)) from None
        try:
            import torch  # noqa: PLC0415
        except ImportError as exc:
            raise _refuse(f"needs torch (with CUDA) for device buffers: {exc}") from None
        if not torch.cuda.is_available():
            raise _refuse("torch sees no CUDA device")
        try:
            entries = read_manifest(engine_dir)
            cc, _ = device_info(device)
        except BuildError as exc:
            raise _refuse(str(exc)) from None
        for name in (model, verify):
            if name not in entries:
                raise _refuse(f"no engine {name!r} in {os.fspath(engine_dir)}/manifest.json (has: {sorted(entries)})")
            try:
                check_manifest(entries[name], trt.__version__, cc, engine_path=Path(engine_dir) / entries[name].engine_file)
            except BuildError as exc:
                raise _refuse(str(exc)) from None
        if eos is None:
            if "eos" not in entries[model].meta:
                raise _refuse(f"eos not given and not in the manifest's meta for {model!r}")
            eos = int(entries[model].meta["eos"])
        if "top_k_limit" in entries[verify].meta:
            caps.setdefault("top_k_limit", int(entries[verify].meta["top_k_limit"]))
        dev = _TorchDevice(torch, device)
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        runners = [
            _TrtRunner(
                trt, runtime, name, (Path(engine_dir) / entries[name].engine_file).read_bytes(),
                BufferPlan.from_manifest(entries[name]), dev, cuda_graphs=cuda_graphs, graph_limit=cuda_graph_limit,
            )
            for name in (model, verify)
        ]
        return cls(runners[0], runners[1], dev, eos=eos, **caps)

    @classmethod
    def fake(cls, engine_dir: str | os.PathLike, cfg: Any, **kw: Any) -> "TensorRTPrimitives":
        """The TensorRT fake: the copy-model engine built from ``cfg`` (a
        :class:`~sf_trt.fake.FakeConfig`), with the capabilities ``cfg`` claims."""
        return cls.open(
            engine_dir, model=kw.pop("model", "copy_model"), eos=cfg.eos, verify_rows=cfg.verify_rows,
            truncate_partial=cfg.truncate_partial, kernel_capabilities=cfg.kernel_capabilities,
            top_k_limit=min(cfg.top_k_limit, cfg.vocab), max_rows_per_pass=cfg.max_rows_per_pass, **kw,
        )

    @classmethod
    def stand_in(
        cls, model_graph: Any, verify_graph: Any, *, max_rows_per_pass: int, eos: int, top_k_limit: int,
        max_lanes: int | None = None, max_context: int | None = None, **caps: Any,
    ) -> "TensorRTPrimitives":
        """The same pass logic with onnxruntime on the CPU in place of the
        engines (``model_graph`` / ``verify_graph``: ONNX models or paths).

        Not a production path: it exists so that everything but libnvinfer
        and the device copies is tested where there is no GPU. ``max_lanes``
        / ``max_context`` size a decoder's symbolic caches and bound its lanes
        per pass (as ``sf-trt build --max-lanes/--max-context`` would).
        """
        dims = {"rows": max_rows_per_pass, "logit_rows": max_rows_per_pass, "batch": max_lanes or max_rows_per_pass}
        if max_lanes is not None:
            dims["max_lanes"] = max_lanes
        if max_context is not None:
            dims["cache_len"] = max_context + 1
        model_plan = BufferPlan.from_onnx(model_graph, name="model", dims=dims)
        verify_plan = BufferPlan.from_onnx(verify_graph, name="verify", dims=dims)
        return cls(
            _OrtRunner("model", model_graph, model_plan),
            _OrtRunner("verify", verify_graph, verify_plan),
            _NumpyDevice(),
            eos=eos, top_k_limit=top_k_limit, max_rows_per_pass=max_rows_per_pass, **caps,
        )

    # -- the protocol's backend half --------------------------------------------------------

    def _forward_impl(self, rows: Rows) -> Any:
        return self._model.forward(rows, self.capabilities.vocab)

    def _verify_sample_impl(self, logits: Any, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        dev = self._dev
        if sample.num_rows == 0:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        host = sample_feeds(sample)  # the fields, and the noise keys made from rng_key and position
        feeds = {VERIFY_LOGITS: logits}
        for b in self._verify.plan.inputs():
            if b.name != VERIFY_LOGITS:
                feeds[b.name] = dev.to_device(host[b.name].astype(_numpy_dtype(b.dtype)))
        out = self._verify.run(feeds)
        tokens = dev.to_host(out[VERIFY_TOKENS]).astype(np.int64)
        match = dev.to_host(out[VERIFY_MATCH]).astype(bool)
        return tokens, match

    def _truncate_impl(self, lane: int, length: int) -> None:
        pass  # rollback is the length PrimitivesBase keeps: nothing past it is read

    def logits_host(self, logits: Any) -> np.ndarray:
        return self._dev.to_host(logits).astype(np.float32, copy=False)

    def close(self) -> None:
        if self._model is not None:
            self._model.runner.close()
            self._model.close()
        if self._verify is not None:
            self._verify.close()
        self._model = self._verify = None


def _check_verify_plan(plan: BufferPlan, vocab: int) -> None:
    names = {b.name for b in plan.inputs()}
    wanted = {VERIFY_LOGITS} | set(VERIFY_SAMPLE_INPUTS)
    if names != wanted:
        raise _refuse(
            f"verify engine {plan.engine!r} inputs {sorted(names)}; expected {sorted(wanted)} (logits and sample_feeds' inputs)"
        )
    outs = {b.name for b in plan.outputs()}
    if not {VERIFY_TOKENS, VERIFY_MATCH} <= outs:
        raise _refuse(f"verify engine {plan.engine!r} outputs {sorted(outs)}; expected {VERIFY_TOKENS!r} and {VERIFY_MATCH!r}")
    if plan[VERIFY_LOGITS].shape[1] != vocab:
        raise _refuse(f"verify engine {plan.engine!r} takes vocab {plan[VERIFY_LOGITS].shape[1]}, the model returns {vocab}")

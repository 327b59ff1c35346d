"""Stand-ins for ``tensorrt`` and ``torch`` (CUDA), for the TensorRT backend's tests on a machine with neither.

They compute nothing a GPU would; they record what sf_trt asks of them, so a test can
assert it: which stream each torch op ran on (:class:`FakeTorch`, ``log``), which builder
flags were set by name, what a runtime enqueued on which stream (:class:`FakeTrt`).
Their API is the documented one of the TensorRT Python bindings (10.x/11.x:
``Builder``, ``Runtime``, ``BuilderFlag`` members by name, ``execute_async_v3``) and of
``torch.cuda`` (``Stream``, ``stream(s)`` as the current-stream context, ``CUDAGraph``,
``graph(g, stream=s)``), reduced to what sf_trt calls.
"""

from __future__ import annotations

import contextlib
import itertools
import types
from pathlib import Path
from typing import Any

import numpy as np

# -- torch -------------------------------------------------------------------------------------


class FakeStream:
    _handles = itertools.count(0x1000)

    def __init__(self, torch: "FakeTorch", name: str) -> None:
        self.torch, self.name = torch, name
        self.cuda_stream = next(self._handles)  # the raw cudaStream_t TensorRT enqueues on

    def synchronize(self) -> None:
        self.torch.log.append(("synchronize", self.name))

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class FakeTensor:
    """A "device" tensor over a numpy array; every op that would launch a CUDA kernel or copy
    records ``(op, the current stream's name)`` in its torch's ``log``."""

    def __init__(self, torch: "FakeTorch", a: np.ndarray, on_device: bool = True) -> None:
        self.torch, self.a, self.on_device = torch, a, on_device

    def _op(self, op: str) -> None:
        if self.on_device:
            self.torch.log.append((op, self.torch.cuda.current.name))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.a.shape)

    @property
    def dtype(self) -> str:
        return str(self.a.dtype)

    def _index(self, index: Any) -> Any:
        if isinstance(index, tuple):
            return tuple(i.a if isinstance(i, FakeTensor) else i for i in index)
        return index.a if isinstance(index, FakeTensor) else index

    def __getitem__(self, index: Any) -> "FakeTensor":
        self._op("getitem")
        return FakeTensor(self.torch, self.a[self._index(index)])

    def __setitem__(self, index: Any, values: Any) -> None:
        self._op("setitem")
        self.a[self._index(index)] = values.a if isinstance(values, FakeTensor) else values

    def to(self, device: Any, non_blocking: bool = False) -> "FakeTensor":
        self.torch.log.append(("to_device", self.torch.cuda.current.name))
        return FakeTensor(self.torch, self.a.copy())

    def copy_(self, other: "FakeTensor", non_blocking: bool = False) -> "FakeTensor":
        self._op("copy_")
        self.a[...] = other.a
        return self

    def clone(self) -> "FakeTensor":
        self._op("clone")
        return FakeTensor(self.torch, self.a.copy())

    def float(self) -> "FakeTensor":
        self._op("float")
        return FakeTensor(self.torch, self.a.astype(np.float32))

    def cpu(self) -> "FakeTensor":
        self._op("cpu")
        return FakeTensor(self.torch, self.a.copy(), on_device=False)

    def numpy(self) -> np.ndarray:
        return self.a

    def view(self, *shape: Any) -> "FakeTensor":  # a view launches nothing
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        return FakeTensor(self.torch, self.a.reshape(shape))

    def data_ptr(self) -> int:
        return int(self.a.__array_interface__["data"][0])


class FakeCuda:
    def __init__(self, torch: "FakeTorch") -> None:
        self.torch = torch
        self.default = FakeStream(torch, "default")
        self.current = self.default
        self.streams = 0

    def Stream(self, device: Any = None) -> FakeStream:  # noqa: N802 (torch's name)
        self.streams += 1
        return FakeStream(self.torch, f"private{self.streams}")

    @contextlib.contextmanager
    def stream(self, s: FakeStream):
        before, self.current = self.current, s
        try:
            yield
        finally:
            self.current = before

    def device(self, d: Any):
        return contextlib.nullcontext()

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def get_device_capability(self, device: int = 0) -> tuple[int, int]:
        return (9, 0)

    def get_device_name(self, device: int = 0) -> str:
        return "Fake H200"

    def CUDAGraph(self) -> "FakeGraph":  # noqa: N802
        return FakeGraph(self.torch)

    @contextlib.contextmanager
    def graph(self, g: "FakeGraph", stream: FakeStream | None = None):
        before, self.current = self.current, stream or self.Stream()
        self.torch.capturing = g
        try:
            yield
        finally:
            self.torch.capturing = None
            self.current = before
        g.captured_on = (stream or self.current).name


class FakeGraph:
    def __init__(self, torch: "FakeTorch") -> None:
        self.torch, self.work, self.captured_on = torch, [], None

    def replay(self) -> None:
        self.torch.log.append(("replay", self.torch.cuda.current.name))
        for fn in self.work:
            fn()


class FakeTorch(types.SimpleNamespace):
    """``torch`` as the TensorRT backend uses it; ``log`` holds ``(op, stream name)`` per device op."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str]] = []
        self.capturing: FakeGraph | None = None
        self.cuda = FakeCuda(self)
        self.version = types.SimpleNamespace(cuda="12.8")
        self.__version__ = "2.8.0+fake"
        for name in ("float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"):
            setattr(self, name, name)

    def device(self, kind: str, index: int = 0) -> str:
        return f"{kind}:{index}"

    def from_numpy(self, a: np.ndarray) -> FakeTensor:
        return FakeTensor(self, a, on_device=False)

    def zeros(self, shape: tuple[int, ...], dtype: str, device: Any = None) -> FakeTensor:
        self.log.append(("zeros", self.cuda.current.name))
        return FakeTensor(self, np.zeros(shape, "float32" if dtype == "bfloat16" else dtype))

    def streams_used(self, skip: tuple[str, ...] = ("synchronize",)) -> set[str]:
        return {stream for op, stream in self.log if op not in skip}


# -- tensorrt ----------------------------------------------------------------------------------


_DTYPES = {"float32": "FLOAT", "float16": "HALF", "bfloat16": "BF16", "int32": "INT32", "int64": "INT64", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL"}


class FakeEngine:
    """An engine whose I/O is a :class:`~sf_trt.backends.tensorrt.buffers.BufferPlan`'s."""

    def __init__(self, trt: "FakeTrt", plan: Any) -> None:
        self.trt, self.plan = trt, plan
        self.num_io_tensors = len(plan.buffers)

    def get_tensor_name(self, i: int) -> str:
        return self.plan.buffers[i].name

    def get_tensor_mode(self, name: str) -> str:
        return self.trt.TensorIOMode.INPUT if self.plan[name].mode == "input" else self.trt.TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str) -> str:
        return _DTYPES[self.plan[name].dtype]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.plan[name].shape

    def create_execution_context(self) -> "FakeContext":
        return FakeContext(self)


class FakeContext:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        return tuple(shape) == self.engine.plan[name].shape

    def set_tensor_address(self, name: str, address: int) -> bool:
        return address != 0

    def infer_shapes(self) -> list[str]:
        return []

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.engine.plan[name].shape

    def execute_async_v3(self, stream_handle: int) -> bool:
        torch = self.engine.trt.torch
        entry = ("enqueue", stream_handle, self.engine.plan.engine)
        if torch is not None and torch.capturing is not None:
            torch.capturing.work.append(lambda: self.engine.trt.enqueued.append(entry))
        else:
            self.engine.trt.enqueued.append(entry)
        return True


class FakeConfig:
    def __init__(self, trt: "FakeTrt") -> None:
        self.trt, self.flags, self.cleared, self.pools, self.profiles = trt, set(), set(), {}, []

    def set_flag(self, flag: str) -> None:
        self.flags.add(flag)

    def clear_flag(self, flag: str) -> None:
        self.cleared.add(flag)

    def set_memory_pool_limit(self, pool: str, size: int) -> None:
        self.pools[pool] = size

    def create_timing_cache(self, data: bytes) -> bytes:
        return bytes(data)

    def set_timing_cache(self, cache: bytes, ignore_mismatch: bool) -> bool:
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> types.SimpleNamespace:
        return types.SimpleNamespace(serialize=lambda: b"fake timing cache")

    def add_optimization_profile(self, profile: Any) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1


class FakeBuilder:
    def __init__(self, trt: "FakeTrt", logger: Any) -> None:
        self.trt = trt

    def create_network(self, flags: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(flags=flags)

    def create_builder_config(self) -> FakeConfig:
        self.trt.config = FakeConfig(self.trt)
        return self.trt.config

    def create_optimization_profile(self) -> types.SimpleNamespace:
        shapes = {}
        return types.SimpleNamespace(shapes=shapes, set_shape=lambda name, lo, opt, hi: shapes.__setitem__(name, (lo, opt, hi)))

    def build_serialized_network(self, network: Any, config: FakeConfig) -> bytes:
        """Bytes standing for the engine; the engine they deserialize to has the parsed graph's
        I/O at the profile's one shape (so a runner can be opened on it; it computes zeros)."""
        blob = b"fake engine %d: " % len(self.trt.engines) + ",".join(sorted(config.flags)).encode()
        path = getattr(network, "onnx_path", None)
        if path is not None and config.profiles:
            from sf_trt.backends.tensorrt.buffers import BufferPlan
            from sf_trt.formats.shapes import onnx_io

            io = list(onnx_io(path))
            dims = {}
            for t in io:
                hi = config.profiles[0].shapes.get(t.name, (None, None, None))[2]
                for k, d in enumerate(t.shape):
                    if isinstance(d, str) and hi is not None:
                        dims[d] = int(hi[k])
            self.trt.engines[blob] = BufferPlan.from_io(Path(path).stem, io, dims)
        return blob


class FakeTrt(types.SimpleNamespace):
    """``tensorrt`` at ``version``, its ``BuilderFlag`` holding ``flags`` (names). ``builder_error`` /
    ``runtime_error``: what ``trt.Builder`` / ``trt.Runtime`` raise (a driver mismatch raises
    ``TypeError: ... factory function returned nullptr``). ``engines`` maps engine bytes to the
    BufferPlan the deserialized engine has. ``torch``: the :class:`FakeTorch` its enqueues see."""

    def __init__(self, version: str = "10.13.0.35", *, flags: tuple[str, ...] = ("TF32", "DISTRIBUTIVE_INDEPENDENCE"),
                 builder_error: Exception | None = None, runtime_error: Exception | None = None,
                 engines: dict[bytes, Any] | None = None, torch: FakeTorch | None = None) -> None:
        super().__init__(__version__=version)
        self.BuilderFlag = types.SimpleNamespace(**{f: f for f in flags})
        self.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=0)
        self.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")
        self.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
        self.DataType = types.SimpleNamespace(**{v: v for v in _DTYPES.values()})
        self.Logger = lambda level=2: types.SimpleNamespace(level=level)  # noqa: E731
        self.Logger.WARNING = 2
        self.builder_error, self.runtime_error = builder_error, runtime_error
        self.engines, self.torch = engines or {}, torch
        self.enqueued: list[tuple] = []
        self.config: FakeConfig | None = None

    def Builder(self, logger: Any) -> FakeBuilder:  # noqa: N802
        if self.builder_error is not None:
            raise self.builder_error
        return FakeBuilder(self, logger)

    def Runtime(self, logger: Any) -> types.SimpleNamespace:  # noqa: N802
        if self.runtime_error is not None:
            raise self.runtime_error
        return types.SimpleNamespace(deserialize_cuda_engine=lambda data: FakeEngine(self, self.engines[bytes(data)]))

    def OnnxParser(self, network: Any, logger: Any) -> types.SimpleNamespace:  # noqa: N802
        def parse_from_file(path: str) -> bool:
            network.onnx_path = path
            return True

        return types.SimpleNamespace(parse_from_file=parse_from_file, num_errors=0)


NULLPTR = TypeError(
    "pybind11::init(): factory function returned nullptr"
)
"""What ``trt.Builder(logger)`` / ``trt.Runtime(logger)`` raise when libnvinfer cannot start (a driver
older than the wheel's CUDA, no GPU visible): NVIDIA/TensorRT issues report exactly this text."""

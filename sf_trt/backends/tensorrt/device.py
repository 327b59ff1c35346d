"""Where the arrays live: numpy on the CPU (the stand-in) or torch on one CUDA device.

One stream. Every torch op the TensorRT backend issues (copies in, gathers of
``new_kv`` rows, the write-back into the caches, the logit rows picked out, the
CUDA-graph input copies) runs on the runtime's own stream, the one TensorRT
enqueues on: an op on torch's default stream would be ordered against neither
the engine's work nor the next write-back (``index_put_`` reading a gather that
has not run yet is silent cache corruption). The adapters enter
:meth:`Device.on_stream` around a whole pass; :class:`TorchDevice`'s own methods
enter it again, so each of them is safe alone too.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Protocol, Sequence

import numpy as np

from .buffers import numpy_dtype

__all__ = ["Device", "NumpyDevice", "TorchDevice"]


class Device(Protocol):
    """Arrays of one place: numpy on the CPU (stand-in) or torch on a CUDA device."""

    def to_device(self, a: np.ndarray) -> Any: ...
    def to_host(self, x: Any) -> np.ndarray: ...
    def zeros(self, shape: Sequence[int], dtype: str) -> Any: ...
    def put(self, buf: Any, index: tuple, values: Any) -> None: ...
    def synchronize(self) -> None: ...
    def on_stream(self) -> ContextManager[Any]:
        """A context in which every array op runs on the runtime's stream."""
        ...


class NumpyDevice:
    def to_device(self, a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a)

    def to_host(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def zeros(self, shape: Sequence[int], dtype: str) -> np.ndarray:
        return np.zeros(tuple(shape), np.dtype(numpy_dtype(dtype)))

    def put(self, buf: np.ndarray, index: tuple, values: np.ndarray) -> None:
        buf[index] = values

    def synchronize(self) -> None:
        pass

    def on_stream(self) -> ContextManager[None]:
        return contextlib.nullcontext()


class TorchDevice:
    """torch tensors on one CUDA device; all work on one stream (:attr:`stream`)."""

    def __init__(self, torch, device: int) -> None:
        self.torch = torch
        self.device = torch.device("cuda", device)
        self.stream = torch.cuda.Stream(self.device)
        self.dtypes = {
            "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
            "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
        }

    def on_stream(self):
        """torch's current stream is :attr:`stream` inside this context."""
        return self.torch.cuda.stream(self.stream)

    def to_device(self, a: np.ndarray):
        with self.on_stream():
            return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.device, non_blocking=False)

    def to_host(self, x) -> np.ndarray:
        with self.on_stream():
            if x.dtype == self.torch.bfloat16:
                x = x.float()
            host = x.cpu()  # on the stream, after everything enqueued on it
        self.stream.synchronize()
        return host.numpy()

    def zeros(self, shape, dtype: str):
        with self.on_stream():
            return self.torch.zeros(tuple(shape), dtype=self.dtypes[dtype], device=self.device)

    def put(self, buf, index: tuple, values) -> None:
        with self.on_stream():
            buf[index] = values

    def synchronize(self) -> None:
        self.stream.synchronize()

    def current(self):
        """A context in which this device is CUDA's current device (TensorRT binds an engine,
        and enqueues its work, on the current device)."""
        return self.torch.cuda.device(self.device)

    def clear_error(self) -> None:
        """Clear CUDA's last error after a failed graph capture (as trtexec does), where
        cuda-python is installed to read it; synchronize the stream either way."""
        try:
            from .probes import _cudart  # noqa: PLC0415

            _cudart().cudaGetLastError()
        except ImportError:
            pass
        try:
            self.stream.synchronize()
        except RuntimeError:
            pass

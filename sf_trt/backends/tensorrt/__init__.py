"""The TensorRT backend: engines built by ``sf-trt build``, behind the Primitives protocol.

Importing this package needs neither TensorRT nor a GPU: ``tensorrt`` and
``torch`` are imported only inside :meth:`TensorRTPrimitives.open`.

* :mod:`.primitives` — :class:`TensorRTPrimitives`, the backend;
* :mod:`.adapters` — the copy model or a decoder over their state buffers;
* :mod:`.runners` — a TensorRT engine (with CUDA graphs), or its ONNX graph on onnxruntime;
* :mod:`.buffers` — what to allocate, from a graph or a manifest;
* :mod:`.device` — numpy or torch arrays;
* :mod:`.probes` — TensorRT, the GPU, type names; :mod:`.errors`.
"""

from .buffers import BufferPlan, BufferSpec
from .errors import TensorRTError, TensorRTUnavailable
from .primitives import TensorRTPrimitives
from .runners import EngineRunner

__all__ = ["BufferPlan", "BufferSpec", "EngineRunner", "TensorRTError", "TensorRTUnavailable", "TensorRTPrimitives"]

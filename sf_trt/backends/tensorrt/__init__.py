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

import importlib

_EXPORTS = {
    "BufferPlan": "buffers", "BufferSpec": "buffers", "EngineRunner": "runners",
    "TensorRTError": "errors", "TensorRTUnavailable": "errors", "TensorRTPrimitives": "primitives",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # imported on first use: importing one submodule (the command line's parser imports
    # .errors) does not import the backend, the verify graph and onnx with it
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)

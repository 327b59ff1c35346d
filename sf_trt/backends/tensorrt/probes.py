"""What this machine has: TensorRT, a CUDA GPU, and the names of TensorRT's types.

Imported lazily (only here is ``tensorrt``, ``torch`` or ``cuda-python``
imported), so the rest of sf_trt runs where none of them is installed.
"""

from __future__ import annotations

from .errors import TensorRTUnavailable

__all__ = ["import_tensorrt", "device_info", "trt_dtype_name"]


def import_tensorrt():
    """``tensorrt``, or :class:`TensorRTUnavailable` saying why it cannot be used."""
    try:
        import tensorrt as trt  # noqa: PLC0415 (lazy by design: only builds and runs need it)
    except Exception as exc:  # ImportError, or a broken install raising OSError on libnvinfer
        raise TensorRTUnavailable(f"TensorRT not available: {type(exc).__name__}: {exc}") from None
    major = int(str(getattr(trt, "__version__", "0")).split(".")[0] or 0)
    if major < 10:
        raise TensorRTUnavailable(f"TensorRT {getattr(trt, '__version__', '?')} found; expected 10 or newer")
    return trt


def device_info(device: int = 0) -> tuple[str, str]:
    """``(compute capability 'major.minor', GPU name)`` of CUDA device ``device``.

    Tries torch, then cuda-python; :class:`TensorRTUnavailable` when neither sees a GPU.
    """
    errors = []
    try:
        import torch  # noqa: PLC0415

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device)
            return f"{major}.{minor}", torch.cuda.get_device_name(device)
        errors.append("torch: no CUDA device")
    except ImportError as exc:
        errors.append(f"torch: {exc}")
    try:
        cudart = _cudart()
        err, prop = cudart.cudaGetDeviceProperties(device)
        if int(err) == 0:
            name = prop.name.decode(errors="replace") if isinstance(prop.name, bytes) else str(prop.name)
            return f"{prop.major}.{prop.minor}", name.rstrip("\x00")
        errors.append(f"cuda-python: cudaGetDeviceProperties returned {err}")
    except ImportError as exc:
        errors.append(f"cuda-python: {exc}")
    raise TensorRTUnavailable("no CUDA GPU visible (" + "; ".join(errors) + ")")


def _cudart():
    try:
        from cuda.bindings import runtime as cudart  # noqa: PLC0415  (cuda-python >= 12.6)
    except ImportError:
        from cuda import cudart  # noqa: PLC0415  (older cuda-python)
    return cudart


def trt_dtype_name(trt, dtype) -> str:
    """The numpy name of TensorRT data type ``dtype`` (``"bfloat16"`` for BF16)."""
    names = {
        "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
        "INT8": "int8", "UINT8": "uint8", "BOOL": "bool", "FP8": "float8_e4m3fn", "INT4": "int4",
    }
    for key, value in names.items():
        if getattr(trt.DataType, key, None) == dtype:
            return value
    raise TensorRTUnavailable(f"engine tensor of TensorRT type {dtype}; expected one of {sorted(names)}")

"""What this machine has: TensorRT, a CUDA GPU, and the names of TensorRT's types.

Imported lazily (only here is ``tensorrt``, ``torch`` or ``cuda-python``
imported), so the rest of sf_trt runs where none of them is installed.
"""

from __future__ import annotations

from .errors import TensorRTUnavailable

__all__ = [
    "TENSORRT_RANGE", "TENSORRT_REQUIREMENT", "tensorrt_version", "check_tensorrt_version",
    "import_tensorrt", "device_info", "trt_dtype_name",
]

TENSORRT_RANGE = ((10, 0), (12, 0))
"""The TensorRT versions sf_trt supports: ``[10.0, 12)``. The floor is where INT64 engine
I/O and element-wise INT64 (the graphs are int64 end to end) and every Python call
sf_trt makes exist; 10.x needs ``STRONGLY_TYPED`` at network creation, 11.x is always
strongly typed (its precision builder flags are gone); 12 is refused until read
(it may remove more). Sources: docs/tensorrt.md, "Supported TensorRT"."""
TENSORRT_REQUIREMENT = "tensorrt>=10.0,<12"
"""The same range as a requirement: what pyproject's ``gpu`` extra states."""


def tensorrt_version(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a TensorRT version string (``"10.13.0.35"`` -> ``(10, 13)``);
    ValueError for anything else."""
    parts = str(version).split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"TensorRT version {version!r} is not 'major.minor[.patch...]'")
    return int(parts[0]), int(parts[1])


def check_tensorrt_version(version: str) -> tuple[int, int]:
    """``(major, minor)`` of ``version`` when sf_trt supports it, else
    :class:`TensorRTUnavailable` in one line naming the range."""
    try:
        found = tensorrt_version(version)
    except ValueError as exc:
        raise TensorRTUnavailable(f"{exc}; sf_trt supports {TENSORRT_REQUIREMENT}") from None
    lo, hi = TENSORRT_RANGE
    if not lo <= found < hi:
        raise TensorRTUnavailable(f"TensorRT {version} found; sf_trt supports {TENSORRT_REQUIREMENT} (pip install '{TENSORRT_REQUIREMENT}')")
    return found


def import_tensorrt():
    """``tensorrt`` of a supported version (:data:`TENSORRT_RANGE`), or
    :class:`TensorRTUnavailable` saying in one line why it cannot be used."""
    try:
        import tensorrt as trt  # noqa: PLC0415 (lazy by design: only builds and runs need it)
    except Exception as exc:  # ImportError, or a broken install raising OSError on libnvinfer
        raise TensorRTUnavailable(f"TensorRT not available: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    check_tensorrt_version(str(getattr(trt, "__version__", "?")))
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

"""What this machine has: TensorRT, a CUDA GPU, and the names of TensorRT's types.

Imported lazily (only here is ``tensorrt``, ``torch`` or ``cuda-python``
imported), so the rest of sf_trt runs where none of them is installed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .errors import TensorRTUnavailable

__all__ = [
    "TENSORRT_RANGE", "TENSORRT_REQUIREMENT", "CUDA_MAJORS", "tensorrt_version", "check_tensorrt_version",
    "import_tensorrt", "device_info", "trt_dtype_name", "StackVersions", "stack_versions", "start_tensorrt",
    "cuda_mismatch", "onnxruntime_distributions",
]

TENSORRT_RANGE = ((10, 12), (12, 0))
"""The TensorRT versions sf_trt supports: ``[10.12, 12)``. The floor is where
``BuilderFlag.DISTRIBUTIVE_INDEPENDENCE`` appears (every engine is built with it), and it
sits above 10.0/10.1, whose ONNX parser is laxer than the op table sf_trt checks against
(docs/tensorrt.md, "Supported TensorRT"); 10.x needs ``STRONGLY_TYPED`` at network
creation, 11.x is always strongly typed (its precision builder flags are gone); 12 is
refused until read (it may remove more)."""
TENSORRT_REQUIREMENT = "tensorrt>=10.12,<12"
"""The same range as a requirement; pyproject's ``gpu-cu12`` / ``gpu-cu13`` extras state it for
the ``tensorrt-cu12`` / ``tensorrt-cu13`` wheels."""
CUDA_MAJORS = (12, 13)
"""The CUDA majors with a ``gpu-cuNN`` extra (``tensorrt-cuNN`` wheels)."""


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


# -- the stack: driver, CUDA, TensorRT ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StackVersions:
    """What this machine has, each ``None`` where not found: the kernel driver (``570.86.15``),
    the CUDA version the driver supports (``12.8``), the CUDA runtime torch was built with,
    torch, TensorRT and the wheel it came from (``tensorrt-cu12``: its CUDA major), the GPU."""

    driver: str | None = None
    driver_cuda: str | None = None
    torch_cuda: str | None = None
    torch: str | None = None
    tensorrt: str | None = None
    tensorrt_wheel: str | None = None
    gpu: str | None = None

    @property
    def tensorrt_cuda_major(self) -> int | None:
        """The CUDA major of the TensorRT wheel (``tensorrt-cu13`` -> 13); None when unknown or
        when wheels of several majors are installed."""
        wheel = self.tensorrt_wheel or ""
        major = wheel.rsplit("-cu", 1)[-1]
        return int(major) if wheel.startswith("tensorrt-cu") and major.isdigit() else None

    def line(self) -> str:
        """One line: ``driver 570.86.15 (CUDA 12.8), CUDA runtime 12.8 (torch 2.8.0), TensorRT 10.13.0.35 (tensorrt-cu12)``."""
        na = "not found"
        driver = f"driver {self.driver or na} (CUDA {self.driver_cuda or na})"
        runtime = f"CUDA runtime {self.torch_cuda or na} (torch {self.torch or na})"
        trt = f"TensorRT {self.tensorrt or na}" + (f" ({self.tensorrt_wheel})" if self.tensorrt_wheel else "")
        return ", ".join([driver, runtime, trt] + ([f"GPU {self.gpu}"] if self.gpu else []))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _driver_version() -> str | None:
    """The NVIDIA kernel driver's version (``570.86.15``), from ``/proc/driver/nvidia/version`` (Linux)."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    for word in text.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return None


def _driver_cuda() -> str | None:
    """The newest CUDA the driver supports (``cudaDriverGetVersion``), where cuda-python is installed."""
    try:
        err, version = _cudart().cudaDriverGetVersion()
    except Exception:  # ImportError, or a cuda-python that cannot load libcudart
        return None
    return f"{int(version) // 1000}.{int(version) % 1000 // 10}" if int(err) == 0 and int(version) > 0 else None


def _torch_versions() -> tuple[str | None, str | None]:
    """``(torch version, CUDA runtime torch was built with)``; ``None`` where absent."""
    try:
        import torch  # noqa: PLC0415
    except Exception:
        return None, None
    return str(torch.__version__), (str(torch.version.cuda) if getattr(torch.version, "cuda", None) else None)


def _tensorrt_wheel() -> str | None:
    """The installed ``tensorrt-cuNN`` distribution (its libraries' CUDA major), if any."""
    try:
        from importlib import metadata  # noqa: PLC0415
    except ImportError:  # pragma: no cover
        return None
    found = []
    for major in (11, *CUDA_MAJORS):
        try:
            metadata.version(f"tensorrt-cu{major}")
            found.append(f"tensorrt-cu{major}")
        except metadata.PackageNotFoundError:
            pass
    return " + ".join(found) or None


def stack_versions(trt=None, device: int = 0) -> StackVersions:
    """What :class:`StackVersions` finds here; never raises (a part not found is ``None``)."""
    torch_version, torch_cuda = _torch_versions()
    try:
        cc, name = device_info(device)
        gpu = f"{name} (compute capability {cc})"
    except TensorRTUnavailable:
        gpu = None
    return StackVersions(
        driver=_driver_version(), driver_cuda=_driver_cuda(), torch_cuda=torch_cuda, torch=torch_version,
        tensorrt=str(getattr(trt, "__version__", "")) or None if trt is not None else None,
        tensorrt_wheel=_tensorrt_wheel(), gpu=gpu,
    )


def cuda_mismatch(v: StackVersions) -> str | None:
    """Why this stack's CUDA majors disagree (TensorRT's wheel against torch's runtime, or
    either against what the driver supports), in one line; ``None`` when they agree or a
    part is unknown."""
    if v.tensorrt_wheel and " + " in v.tensorrt_wheel:
        return f"TensorRT wheels of several CUDA majors are installed ({v.tensorrt_wheel}): keep the one of torch's CUDA"
    trt_major = v.tensorrt_cuda_major
    torch_major = int(v.torch_cuda.split(".")[0]) if v.torch_cuda and v.torch_cuda.split(".")[0].isdigit() else None
    driver_major = int(v.driver_cuda.split(".")[0]) if v.driver_cuda and v.driver_cuda.split(".")[0].isdigit() else None
    if trt_major and torch_major and trt_major != torch_major:
        return (
            f"TensorRT's wheel is {v.tensorrt_wheel} (CUDA {trt_major}) but torch {v.torch} runs CUDA {v.torch_cuda}: "
            f"install sf_trt[gpu-cu{torch_major}] (the extra of torch's CUDA major)"
        )
    for what, major in (("TensorRT", trt_major), ("torch", torch_major)):
        if major and driver_major and major > driver_major:
            return f"{what} needs CUDA {major} but the driver ({v.driver or 'version not found'}) supports CUDA {v.driver_cuda}: update the driver"
    return None


def start_tensorrt(trt, what: str, *args):
    """``trt.<what>(*args)`` (``Builder`` or ``Runtime``), or :class:`TensorRTUnavailable` in one
    line naming the driver, CUDA and TensorRT found when TensorRT cannot start: the bindings
    raise ``TypeError: ... factory function returned nullptr`` (or return ``None``) when
    libnvinfer cannot talk to the driver, e.g. a driver older than the wheel's CUDA."""
    try:
        made = getattr(trt, what)(*args)
    except (TypeError, RuntimeError) as exc:
        cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    else:
        if made:
            return made
        cause = "it returned None"
    v = stack_versions(trt)
    hint = cuda_mismatch(v) or "is a GPU visible, and does the driver support the CUDA of TensorRT's wheel?"
    raise TensorRTUnavailable(f"trt.{what} could not start ({cause}); found {v.line()}; {hint}")


def onnxruntime_distributions() -> list[str]:
    """The installed wheels that write the ``onnxruntime`` package (``onnxruntime``,
    ``onnxruntime-gpu``, ``onnxruntime-openvino``, ...). Two of them overwrite each other's
    files: one must go."""
    from importlib import metadata  # noqa: PLC0415

    names = set()
    for dist in metadata.distributions():
        if any(str(f).replace("\\", "/").startswith("onnxruntime/") for f in (dist.files or ())):
            names.add((dist.metadata["Name"] or "?").lower().replace("_", "-"))
    return sorted(names)

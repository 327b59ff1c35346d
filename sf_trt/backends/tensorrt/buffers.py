"""What to allocate for one engine: every I/O tensor at its largest profile shape.

A :class:`BufferPlan` is built from the ONNX graph alone (:meth:`BufferPlan.from_onnx`)
or from a manifest entry (:meth:`BufferPlan.from_manifest`); the same plan
allocates the device buffers and is checked against the deserialized engine's
own I/O.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ...formats.shapes import ShapeLimits, derive_profiles, onnx_io
from .errors import refuse

__all__ = ["BufferSpec", "BufferPlan", "numpy_dtype"]

_ITEMSIZE = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8,
    "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1,
}


def numpy_dtype(dtype: str):
    """The numpy dtype of a buffer dtype name (``ml_dtypes.bfloat16`` for ``"bfloat16"``)."""
    if dtype == "bfloat16":
        import ml_dtypes  # noqa: PLC0415 (numpy has no bfloat16 of its own)

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


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
    """The size of each named dim (e.g. ``{"rows": 256}``): every run has exactly these shapes."""

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
                        raise refuse(
                            f"{engine}: {t.mode} {t.name!r} dim {k} is named {d!r}, which no input's profile bounds "
                            f"(bounded: {sorted(dims)})"
                        )
                    shape.append(int(dims[d]))
                elif int(d) < 0:
                    raise refuse(f"{engine}: {t.mode} {t.name!r} dim {k} is dynamic without a name")
                else:
                    shape.append(int(d))
            if t.dtype not in _ITEMSIZE:
                raise refuse(f"{engine}: {t.mode} {t.name!r} has dtype {t.dtype}; expected one of {sorted(_ITEMSIZE)}")
            specs.append(BufferSpec(t.name, t.mode, t.dtype, tuple(shape)))
        return BufferPlan(engine, tuple(specs), dict(dims))

    @staticmethod
    def from_onnx(graph: Any, limits: ShapeLimits | None = None, *, name: str | None = None, dims: Mapping[str, int] | None = None) -> "BufferPlan":
        """From an ONNX graph (a ``ModelProto`` or a path) and the shape limits
        its engine is (to be) built with (``dims``: the max of each dim name instead)."""
        if dims is None:
            dims = derive_profiles(graph, limits or ShapeLimits()).max_dims()
        if name is None:
            name = Path(os.fspath(graph)).stem if isinstance(graph, (str, os.PathLike)) else (graph.graph.name or "graph")
        return BufferPlan.from_io(name, onnx_io(graph), dims)

    @staticmethod
    def from_manifest(entry: Any) -> "BufferPlan":
        """From a manifest entry (:class:`~sf_trt.formats.manifest.EngineManifest`), whose one
        profile must be fixed: an engine that takes several shapes is refused (its rows could
        come out differently in passes of different shapes; docs/tensorrt.md)."""
        if len(entry.profiles) != 1:
            raise refuse(f"engine {entry.name!r} has {len(entry.profiles)} optimization profiles; expected one. Rebuild it with `sf-trt build`.")
        unfixed = entry.profiles[0].unfixed()
        if unfixed:
            raise refuse(
                f"engine {entry.name!r} takes more than one shape ({', '.join(unfixed)}): its rows could differ with "
                "the shape of the pass. Rebuild it with `sf-trt build` (every engine takes one shape, min = opt = max)."
            )
        return BufferPlan.from_io(entry.name, entry.io, entry.profiles[0].max_dims())

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

"""Engine I/O shapes: the names of dynamic dims, what bounds them, and profiles.

Graph authors name every dynamic dim with a name from :data:`DIM_ROLES`; its
role says what bounds it: :class:`ShapeLimits` (rows per pass, lanes, context)
for the dims that vary per pass, and the state's own size for the fixed ones.
``sf-trt build`` derives each engine's optimization profile from these names
(:func:`derive_profiles`) and records it in the manifest; the TensorRT backend
sizes its device buffers from the same profile.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import onnx

__all__ = [
    "ShapeError", "ShapeLimits", "DIM_ROLES", "ROLE_LIMITS", "FIXED_ROLES",
    "IOTensor", "onnx_io", "Profile", "derive_profiles",
]


class ShapeError(ValueError):
    """A graph's I/O or a shape limit that cannot be used; the message says what was expected."""


# The one table from a graph's dim names to what bounds them. Graph authors:
# name a dynamic dim with one of these; a dim named otherwise is refused by
# derive_profiles. In use: the verify graph and the copy model "rows"; the
# decoder "batch", "rows" (rows per lane), "logit_rows", and, when exported with
# symbolic caches, "max_lanes" and "cache_len" (= max_context + 1).
DIM_ROLES: dict[str, str] = {
    # rows of one forward pass (the decoder: rows per lane), and the logit rows it returns
    "rows": "rows_per_pass", "R": "rows_per_pass", "num_rows": "rows_per_pass",
    "logit_rows": "rows_per_pass", "K": "rows_per_pass",
    # lanes in a pass
    "lanes": "lanes", "B": "lanes", "batch": "lanes", "num_lanes": "lanes",
    # positions of a lane's state
    "context": "context", "T": "context", "ctx": "context", "past": "context", "kv_len": "context",
    # the state's own size (fixed: min = opt = max)
    "max_lanes": "lane_slots", "cache_len": "cache_len",
}
ROLE_LIMITS = ("rows_per_pass", "lanes", "context")
"""Roles bounded by ``ShapeLimits.max_<role>`` (min 1)."""
FIXED_ROLES = {
    "lane_slots": lambda limits: limits.max_lanes,
    "cache_len": lambda limits: limits.max_context + 1,  # one trash slot past the last position
}
"""Roles of state-buffer dims: exactly this size in every profile."""


@dataclasses.dataclass(frozen=True)
class ShapeLimits:
    """The largest pass an engine takes, and the shapes its kernels are tuned for.

    ``max_rows_per_pass``, ``max_lanes``, ``max_context`` bound the dims by role
    (:data:`DIM_ROLES`); the ``opt_*`` points are the shapes TensorRT tunes
    kernels for (defaults: rows = lanes = ``max_lanes``, one decode row per lane;
    context = ``max_context``).
    """

    max_rows_per_pass: int = 256
    max_lanes: int = 8
    max_context: int = 2048
    opt_rows_per_pass: int | None = None
    opt_lanes: int | None = None
    opt_context: int | None = None

    def __post_init__(self) -> None:
        for role in ROLE_LIMITS:
            top = getattr(self, f"max_{role}")
            if isinstance(top, bool) or not isinstance(top, int) or top < 1:
                raise ShapeError(f"{type(self).__name__}: max_{role} must be an int >= 1 (got {top!r})")
            opt = getattr(self, f"opt_{role}")
            if opt is not None and (isinstance(opt, bool) or not isinstance(opt, int) or not 1 <= opt <= top):
                raise ShapeError(f"{type(self).__name__}: opt_{role} must be an int in 1..max_{role}={top} (got {opt!r})")

    def limits(self, role: str) -> tuple[int, int, int]:
        """``(min, opt, max)`` of a dim with this role."""
        if role in FIXED_ROLES:  # a state buffer's size: allocated once, never varies
            n = FIXED_ROLES[role](self)
            return n, n, n
        top = getattr(self, f"max_{role}")
        opt = getattr(self, f"opt_{role}")
        if opt is None:
            opt = min(self.max_lanes, top) if role == "rows_per_pass" else top
        return 1, opt, top


_ONNX_DTYPE = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.DOUBLE: "float64",
}


@dataclasses.dataclass(frozen=True)
class IOTensor:
    """One engine input or output: ``shape`` holds ints for static dims and
    the graph's dim names (str) for dynamic ones; ``dtype`` is a numpy name
    (``"bfloat16"`` for BF16)."""

    name: str
    mode: str  # "input" | "output"
    dtype: str
    shape: tuple[int | str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "IOTensor":
        return IOTensor(str(d["name"]), str(d["mode"]), str(d["dtype"]), tuple(d["shape"]))


def load_graph(graph: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """``graph`` itself, or the ONNX file at that path without its external data."""
    if isinstance(graph, onnx.ModelProto):
        return graph
    try:
        return onnx.load(os.fspath(graph), load_external_data=False)
    except Exception as exc:
        raise ShapeError(f"cannot load {os.fspath(graph)!r} as ONNX ({type(exc).__name__}: {exc})") from None


def onnx_io(graph: onnx.ModelProto | str | os.PathLike) -> list[IOTensor]:
    """The graph's runtime inputs (initializers excluded) and outputs."""
    model = load_graph(graph)
    inits = {t.name for t in model.graph.initializer}
    out: list[IOTensor] = []
    for mode, vis in (("input", [v for v in model.graph.input if v.name not in inits]), ("output", model.graph.output)):
        for vi in vis:
            out.append(_io_tensor(mode, vi))
    return out


def _io_tensor(mode: str, vi: onnx.ValueInfoProto) -> IOTensor:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        raise ShapeError(f"graph {mode} {vi.name!r} has no tensor shape; expected a typed, ranked tensor")
    dtype = _ONNX_DTYPE.get(tt.elem_type)
    if dtype is None:
        raise ShapeError(
            f"graph {mode} {vi.name!r} of type {onnx.TensorProto.DataType.Name(tt.elem_type)}; "
            f"expected one of {sorted(set(_ONNX_DTYPE.values()))}"
        )
    dims: list[int | str] = []
    for k, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(d.dim_param)
        else:
            raise ShapeError(f"graph {mode} {vi.name!r} dim {k} is dynamic but unnamed; expected a name from DIM_ROLES")
    return IOTensor(vi.name, mode, dtype, tuple(dims))


@dataclasses.dataclass(frozen=True)
class Profile:
    """One optimization profile.

    ``dims``: dim name -> ``(min, opt, max)``; ``inputs``: each input with a
    dynamic dim -> ``(min_shape, opt_shape, max_shape)``; ``static``: inputs
    whose shape is fixed.
    """

    dims: dict[str, tuple[int, int, int]]
    inputs: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    static: dict[str, tuple[int, ...]]

    def max_dims(self) -> dict[str, int]:
        return {name: rng[2] for name, rng in self.dims.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "dims": {k: list(v) for k, v in self.dims.items()},
            "inputs": {k: {"min": list(a), "opt": list(b), "max": list(c)} for k, (a, b, c) in self.inputs.items()},
            "static": {k: list(v) for k, v in self.static.items()},
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Profile":
        return Profile(
            {k: tuple(int(x) for x in v) for k, v in d["dims"].items()},
            {k: (tuple(v["min"]), tuple(v["opt"]), tuple(v["max"])) for k, v in d["inputs"].items()},
            {k: tuple(v) for k, v in d.get("static", {}).items()},
        )


def derive_profiles(graph: onnx.ModelProto | str | os.PathLike, limits: ShapeLimits) -> Profile:
    """The optimization profile of ``graph`` under ``limits``.

    Each dynamic dim of each input is named; its name's role in
    :data:`DIM_ROLES` gives its ``(min, opt, max)`` from ``limits``. Raises
    :class:`ShapeError` naming the input and dim when a name has no role.
    """
    dims: dict[str, tuple[int, int, int]] = {}
    inputs: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    static: dict[str, tuple[int, ...]] = {}
    for t in onnx_io(graph):
        if t.mode != "input":
            continue
        if all(isinstance(d, int) for d in t.shape):
            static[t.name] = tuple(int(d) for d in t.shape)
            continue
        ranges = [(d, d, d) if isinstance(d, int) else dims.setdefault(d, limits.limits(_role(t.name, k, d))) for k, d in enumerate(t.shape)]
        inputs[t.name] = tuple(tuple(r[i] for r in ranges) for i in range(3))  # type: ignore[assignment]
    return Profile(dims, inputs, static)


def _role(input_name: str, k: int, dim: str) -> str:
    role = DIM_ROLES.get(dim)
    if role is None:
        known = ", ".join(f"{r}: {sorted(n for n, rr in DIM_ROLES.items() if rr == r)}" for r in (*ROLE_LIMITS, *FIXED_ROLES))
        raise ShapeError(
            f"derive_profiles: input {input_name!r} dim {k} is named {dim!r}, which has no role; "
            f"expected one of the names in DIM_ROLES ({known})"
        )
    return role

"""Engine I/O shapes: the names of dims, the one shape every pass has, and profiles.

Graph authors name every dynamic dim with a name from :data:`DIM_ROLES`; its
role says what sizes it: :class:`ShapeLimits` (lanes, rows per lane, context) for
the dims of a pass, and the state's own size for the state buffers. Every engine
sf_trt builds takes **one shape**: its optimization profile is fixed (min = opt =
max) and the runtime pads every pass to it and splits what does not fit, so a row
is always computed by the same engine on the same shapes, whatever else shares its
pass (docs/tensorrt.md, "Rows bit-identical"). ``sf-trt build`` derives each
engine's profile from these names (:func:`derive_profiles`, :func:`profile_of`) and
records it in the manifest; the TensorRT backend sizes its buffers from it and
refuses an engine whose profile is not fixed (:meth:`Profile.unfixed`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ..abi import LOGIT_BIAS_MAX_TOKENS, STOP_TOKEN_IDS_MAX

if TYPE_CHECKING:
    import onnx

__all__ = [
    "ShapeError", "ShapeLimits", "DIM_ROLES", "ROLES",
    "IOTensor", "onnx_io", "Profile", "derive_profiles", "profile_of",
]


class ShapeError(ValueError):
    """A graph's I/O or a shape that cannot be used; the message says what was expected."""


# The one table from a graph's dim names to what sizes them. Graph authors: name a
# dynamic dim with one of these; a dim named otherwise is refused by profile_of. In
# use: the verify graph and the copy model "rows"; the decoder "batch",
# "rows_per_lane", "logit_rows", and, when exported with symbolic caches,
# "max_lanes" and "cache_len" (= max_context + 1).
DIM_ROLES: dict[str, str] = {
    # rows of one run of a row-flat graph (verify, copy model), and the decoder's logit rows
    "rows": "rows_per_pass", "R": "rows_per_pass", "num_rows": "rows_per_pass",
    "logit_rows": "rows_per_pass", "K": "rows_per_pass",
    # the decoder's rows of each lane in one run
    "rows_per_lane": "rows_per_lane",
    # lanes in a run
    "lanes": "lanes", "B": "lanes", "batch": "lanes", "num_lanes": "lanes",
    # positions of a lane's state
    "context": "context", "T": "context", "ctx": "context", "past": "context", "kv_len": "context",
    # the state's own size
    "max_lanes": "lane_slots", "cache_len": "cache_len",
    # entries of a logits row the adjust graph rewrites (sf_trt.graphs.adjust)
    "adjust_entries": "adjust_entries",
}
ROLES = {
    "rows_per_pass": lambda limits: limits.rows_per_pass,
    "rows_per_lane": lambda limits: limits.rows_per_lane,
    "lanes": lambda limits: limits.max_lanes,
    "context": lambda limits: limits.max_context,
    "lane_slots": lambda limits: limits.max_lanes,
    "cache_len": lambda limits: limits.max_context + 1,  # one trash slot past the last position
    # a lane's distinct tokens (at most its context), its logit bias and its stop ids
    "adjust_entries": lambda limits: limits.max_context + LOGIT_BIAS_MAX_TOKENS + STOP_TOKEN_IDS_MAX,
}
"""Role -> its size under a :class:`ShapeLimits`."""


@dataclasses.dataclass(frozen=True)
class ShapeLimits:
    """The one shape of every run of an engine.

    ``max_lanes``: lanes in a run, which is also the state's lane slots (a lane
    sits at its own slot in every run); ``rows_per_lane``: the decoder's rows of
    each lane in a run (a plain decode step uses 1, a verify pass 1 + the draft; a
    lane with more is split across runs); ``max_context``: positions per lane.
    The row-flat graphs (verify, copy model) and the decoder's logit rows take
    :attr:`rows_per_pass` = ``max_lanes * rows_per_lane`` rows a run.
    """

    max_lanes: int = 8
    rows_per_lane: int = 16
    max_context: int = 2048

    def __post_init__(self) -> None:
        for name in ("max_lanes", "rows_per_lane", "max_context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ShapeError(f"{type(self).__name__}: {name} must be an int >= 1 (got {value!r})")

    @property
    def rows_per_pass(self) -> int:
        return self.max_lanes * self.rows_per_lane

    def size(self, role: str) -> int:
        """The size of a dim with this role (:data:`ROLES`)."""
        return ROLES[role](self)


_ONNX_DTYPE = {  # onnx.TensorProto's element types (onnx is imported where a graph is read)
    1: "float32",  # FLOAT
    10: "float16",  # FLOAT16
    16: "bfloat16",  # BFLOAT16
    6: "int32",  # INT32
    7: "int64",  # INT64
    3: "int8",  # INT8
    2: "uint8",  # UINT8
    9: "bool",  # BOOL
    11: "float64",  # DOUBLE
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
    import onnx

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
        import onnx

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
    whose shape is fixed in the graph. sf_trt builds only fixed profiles
    (min = opt = max); :meth:`unfixed` names the dims of any other.
    """

    dims: dict[str, tuple[int, int, int]]
    inputs: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    static: dict[str, tuple[int, ...]]

    def max_dims(self) -> dict[str, int]:
        return {name: rng[2] for name, rng in self.dims.items()}

    def unfixed(self) -> list[str]:
        """What is not fixed: each dim and input whose min, opt and max differ (empty: a fixed profile)."""
        out = [f"{name} {lo}..{hi}" for name, (lo, mid, hi) in self.dims.items() if not lo == mid == hi]
        return out + [f"input {name} {list(lo)}..{list(hi)}" for name, (lo, mid, hi) in self.inputs.items() if not lo == mid == hi]

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


def profile_of(io: Iterable[IOTensor], limits: ShapeLimits) -> Profile:
    """The fixed profile of an engine with I/O ``io`` under ``limits``: each dynamic dim
    of each input is named, and its name's role in :data:`DIM_ROLES` sizes it. Raises
    :class:`ShapeError` naming the input and dim when a name has no role."""
    dims: dict[str, tuple[int, int, int]] = {}
    inputs: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    static: dict[str, tuple[int, ...]] = {}
    for t in io:
        if t.mode != "input":
            continue
        if all(isinstance(d, int) for d in t.shape):
            static[t.name] = tuple(int(d) for d in t.shape)
            continue
        shape = []
        for k, d in enumerate(t.shape):
            if isinstance(d, str):
                n = limits.size(_role(t.name, k, d))
                dims.setdefault(d, (n, n, n))
                d = n
            shape.append(int(d))
        inputs[t.name] = (tuple(shape),) * 3  # type: ignore[assignment]
    return Profile(dims, inputs, static)


def derive_profiles(graph: onnx.ModelProto | str | os.PathLike, limits: ShapeLimits) -> Profile:
    """:func:`profile_of` the I/O of ``graph`` (a model or an ONNX file)."""
    return profile_of(onnx_io(graph), limits)


def _role(input_name: str, k: int, dim: str) -> str:
    role = DIM_ROLES.get(dim)
    if role is None:
        known = ", ".join(f"{r}: {sorted(n for n, rr in DIM_ROLES.items() if rr == r)}" for r in ROLES)
        raise ShapeError(
            f"profile_of: input {input_name!r} dim {k} is named {dim!r}, which has no role; "
            f"expected one of the names in DIM_ROLES ({known})"
        )
    return role

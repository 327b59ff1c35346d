"""Interval analysis of a graph's integer tensors: the proof that no backend rounds them.

TensorRT's ONNX parser lowers integer ``Mod`` to ``a - b * FLOOR_DIV(a, b)``, and its
integer division has been seen to round through float32 (NVIDIA/TensorRT#4702:
``18542495 % 32 == -1``; /work/notes/trt-research.md). float32 holds every integer of
magnitude below ``2**24`` exactly, and a float32 divide-then-floor of two such integers
is the exact floor. So a graph is safe on any backend when every operand and result of
its integer arithmetic stays inside ``(-2**24, 2**24)``; :func:`integer_bounds` proves
that for a built graph, from the ranges it declares for its inputs and dims
(:mod:`sf_trt.graphs.ranges`).

``integer_bounds(model)`` walks the main graph once, in order, and gives every integer
tensor an interval ``[lo, hi]`` that holds for all inputs inside the declared ranges
(``None``: not proven bounded). :func:`arithmetic_findings` then lists each integer
``Add``/``Sub``/``Mul``/``Div``/``Mod``/``Neg``/``Abs``/``Range``/``Sum``/``Pow``/
``ReduceSum``/``ReduceProd``/``CumSum`` whose operands or result are not proven inside
the exact range: ``Div``/``Mod`` as errors (the division itself may round), the rest as
warnings (exact wherever integers are computed as integers; the 2**24 bound only
matters on a backend that routes them through float32 too). Ops that only move,
compare or select values (``Gather``, ``Where``, ``Max``, ``Equal``, ``ArgMax``, ...)
compute nothing and need no bound; their outputs take their inputs' ranges.

Intervals forget how values depend on each other, so one idiom is recognised where plain
interval arithmetic would lose the bound: ``Sub(x, Mul(Div(x, c), c))`` with the same
positive constant ``c`` is ``x`` modulo ``c`` (truncating division), inside ``[0, c)``
for ``x >= 0``. It is how the verify hash reduces without ``Mod``, which onnxruntime
computes several times slower.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping

import numpy as np
import onnx
import onnx.shape_inference
from onnx import TensorProto, numpy_helper

from sf_trt.graphs.ranges import Range, declared_ranges

__all__ = [
    "EXACT_LIMIT", "INT_TYPES", "ARITHMETIC", "DIVISION", "Interval", "ArithmeticFinding",
    "integer_bounds", "arithmetic_findings",
]

EXACT_LIMIT = 2**24
"""Integers strictly inside ``(-EXACT_LIMIT, EXACT_LIMIT)`` are exact in float32."""
INT_TYPES = {TensorProto.INT8: 8, TensorProto.INT16: 16, TensorProto.INT32: 32, TensorProto.INT64: 64,
             TensorProto.UINT8: 8, TensorProto.UINT16: 16, TensorProto.UINT32: 32, TensorProto.UINT64: 64}
DIVISION = frozenset({"Div", "Mod"})
ARITHMETIC = DIVISION | {"Add", "Sub", "Mul", "Neg", "Abs", "Range", "Sum", "Pow", "ReduceSum", "ReduceProd", "CumSum"}


@dataclasses.dataclass(frozen=True)
class Interval:
    lo: int
    hi: int

    def union(self, other: "Interval") -> "Interval":
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))

    def magnitude(self) -> int:
        return max(abs(self.lo), abs(self.hi))

    def __str__(self) -> str:
        return f"[{self.lo}, {self.hi}]"


@dataclasses.dataclass(frozen=True)
class ArithmeticFinding:
    """An integer arithmetic node whose values are not proven inside ``(-2**24, 2**24)``."""

    node: str
    op_type: str
    problem: str
    severity: str  # "error" for Div/Mod, "warning" otherwise


def _dtype_range(elem_type: int) -> Interval:
    bits = INT_TYPES[elem_type]
    if elem_type in (TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64):
        return Interval(0, 2**bits - 1)
    return Interval(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


def _of_array(arr: np.ndarray) -> Interval | None:
    if arr.size == 0:
        return None
    return Interval(int(arr.min()), int(arr.max()))


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


class _Analysis:
    def __init__(self, model: onnx.ModelProto, inputs: Mapping[str, Range], dims: Mapping[str, Range]) -> None:
        try:
            inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
        except Exception:  # advisory: without types, fewer tensors are known to be integers
            inferred = model
        g = inferred.graph
        self.graph = g
        self.dims = {k: Interval(*v) for k, v in dims.items()}
        self.types: dict[str, int] = {}
        self.shapes: dict[str, list] = {}
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            if vi.type.HasField("tensor_type"):
                self.types[vi.name] = vi.type.tensor_type.elem_type
                if vi.type.tensor_type.HasField("shape"):
                    self.shapes[vi.name] = list(vi.type.tensor_type.shape.dim)
        self.values: dict[str, np.ndarray] = {}
        self.bounds: dict[str, Interval | None] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.undeclared: set[str] = set()  # integer inputs without a declared range
        for t in g.initializer:
            self.types.setdefault(t.name, t.data_type)
            if t.data_type in INT_TYPES and not (t.data_location == TensorProto.EXTERNAL and not t.raw_data):
                arr = numpy_helper.to_array(t)  # integer constants only: float weights can be large
                self.values[t.name] = arr
                self.bounds[t.name] = _of_array(arr)
        for vi in g.input:
            self.values.pop(vi.name, None)  # an input shadows an initializer of the same name
            elem = self.types.get(vi.name)
            if elem in INT_TYPES:
                stated = inputs.get(vi.name)
                self.bounds[vi.name] = Interval(*stated) if stated is not None else _dtype_range(elem)
                if stated is None:
                    self.undeclared.add(vi.name)

    def is_int(self, name: str) -> bool:
        return self.types.get(name) in INT_TYPES

    def get(self, name: str) -> Interval | None:
        return self.bounds.get(name)

    def dim_interval(self, dim) -> Interval | None:
        if dim.HasField("dim_value"):
            return Interval(int(dim.dim_value), int(dim.dim_value))
        return self.dims.get(dim.dim_param) if dim.dim_param else None

    def run(self) -> dict[str, Interval | None]:
        for node in self.graph.node:
            outs = self._node(node)
            for name, iv in zip(node.output, outs):
                self.producer[name] = node
                if name and self.is_int(name):
                    self.bounds[name] = iv
        return self.bounds

    def _scalar(self, name: str) -> int | None:
        arr = self.values.get(name)
        if arr is None and name in self.producer and self.producer[name].op_type == "Constant":
            t = next((a.t for a in self.producer[name].attribute if a.name == "value"), None)
            arr = numpy_helper.to_array(t) if t is not None else None
        if arr is None or arr.size != 1 or arr.dtype.kind not in "iu":
            return None
        return int(arr.reshape(-1)[0])

    def _remainder_of(self, node: onnx.NodeProto) -> Interval | None:
        """``x - c * (x div c)`` (module docstring): ``Sub(x, Mul(Div(x, c), c))``, either
        order of the ``Mul``'s inputs, ``c`` the same positive constant."""
        x, prod = node.input[0], self.producer.get(node.input[1])
        if prod is None or prod.op_type != "Mul":
            return None
        for quotient, factor in ((prod.input[0], prod.input[1]), (prod.input[1], prod.input[0])):
            div = self.producer.get(quotient)
            c = self._scalar(factor)
            if div is None or div.op_type != "Div" or div.input[0] != x or c is None or c <= 0 or self._scalar(div.input[1]) != c:
                continue
            xi = self.get(x)
            if xi is None:
                return Interval(-(c - 1), c - 1)
            if xi.lo >= 0:
                return Interval(0, min(c - 1, xi.hi))
            return Interval(max(-(c - 1), xi.lo), 0 if xi.hi <= 0 else min(c - 1, xi.hi))  # |r| <= |x|, sign of x
        return None

    # -- the transfer functions ---------------------------------------------------------

    def _node(self, node: onnx.NodeProto) -> list[Interval | None]:
        op, ins = node.op_type, [self.get(i) if i else None for i in node.input]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        n_out = len(node.output)
        if op == "Constant":
            return [_constant(attrs)]
        if op == "Sub" and len(node.input) == 2:
            remainder = self._remainder_of(node)
            if remainder is not None:
                return [remainder]
        if op in _ARITHMETIC:
            return [_arithmetic(op, ins)]
        if op in ("Div", "Mod"):
            return [_division(op, ins, attrs)]
        if op in _PASS_THROUGH:
            return [ins[0]] * n_out
        if op == "TopK":
            return [ins[0], self._index_range(node, attrs.get("axis", -1))]
        if op in ("ArgMax", "ArgMin"):
            return [self._index_range(node, attrs.get("axis", 0))]
        if op == "Concat":
            return [self._union(ins)]
        if op in ("ScatterND", "ScatterElements", "Scatter"):
            return [self._union([ins[0], ins[2] if len(ins) > 2 else None])]
        if op == "Pad":
            value = ins[2] if len(ins) > 2 and node.input[2] else Interval(0, 0)
            return [self._union([ins[0], value])]
        if op == "Cast":
            return [self._cast(node, attrs.get("to"), ins[0])]
        if op == "Shape":
            return [self._shape_range(node, attrs)]
        if op == "Size":
            return [self._size(node)]
        if op == "Range":
            return [_range(ins)]
        if op == "ConstantOfShape":
            t = attrs.get("value")
            return [_of_array(numpy_helper.to_array(t)) if isinstance(t, onnx.TensorProto) else Interval(0, 0)]
        return [None] * n_out

    def _cast(self, node: onnx.NodeProto, to: int | None, x: Interval | None) -> Interval | None:
        """An integer Cast keeps its input's range when the target type holds it."""
        src = self.types.get(node.input[0])
        if to not in INT_TYPES:
            return None
        if src == TensorProto.BOOL:
            return Interval(0, 1)
        if src in INT_TYPES and x is not None:
            d = _dtype_range(to)
            return x if d.lo <= x.lo and x.hi <= d.hi else None
        return None

    def _size(self, node: onnx.NodeProto) -> Interval | None:
        dims = self.shapes.get(node.input[0])
        if dims is None:
            return None
        ivs = [self.dim_interval(d) for d in dims]
        if any(i is None for i in ivs):
            return None
        return Interval(int(np.prod([i.lo for i in ivs])), int(np.prod([i.hi for i in ivs])))

    def _union(self, ivs: Iterable[Interval | None]) -> Interval | None:
        ivs = list(ivs)
        if not ivs or any(i is None for i in ivs):
            return None
        out = ivs[0]
        for i in ivs[1:]:
            out = out.union(i)
        return out

    def _index_range(self, node: onnx.NodeProto, axis: int) -> Interval | None:
        dims = self.shapes.get(node.input[0])
        if dims is None:
            return None
        dim = self.dim_interval(dims[axis])
        return None if dim is None else Interval(0, max(0, dim.hi - 1))

    def _shape_range(self, node: onnx.NodeProto, attrs: dict) -> Interval | None:
        dims = self.shapes.get(node.input[0])
        if dims is None:
            return None
        rank = len(dims)
        start, end = attrs.get("start", 0), attrs.get("end", rank)
        start, end = (s + rank if s < 0 else s for s in (start, end))
        return self._union([self.dim_interval(d) for d in dims[max(0, start):min(rank, end)]])


def integer_bounds(
    model: onnx.ModelProto, *, inputs: Mapping[str, Range] | None = None, dims: Mapping[str, Range] | None = None
) -> dict[str, Interval | None]:
    """Every integer tensor of ``model``'s main graph -> its proven interval, or ``None``.

    ``inputs`` / ``dims`` (name -> ``(lo, hi)``) default to what the graph declares
    (:func:`sf_trt.graphs.ranges.declared_ranges`); an integer input without a range is
    taken over its whole dtype, a symbolic dim without one is unbounded."""
    stated_inputs, stated_dims = declared_ranges(model)
    return _Analysis(model, stated_inputs if inputs is None else inputs, stated_dims if dims is None else dims).run()


def _problem(node: onnx.NodeProto, a: _Analysis) -> str | None:
    """What keeps ``node`` from being proven exact, or None."""
    names = [i for i in node.input if i] + [o for o in node.output if o]
    unproven = [n for n in names if a.get(n) is None]
    if unproven:
        return f"values of {unproven} are not proven bounded (declare the graph's input and dim ranges)"
    wide = [n for n in names if a.get(n).magnitude() >= EXACT_LIMIT]
    if wide:
        undeclared = [n for n in wide if n in a.undeclared]
        what = ", ".join(f"{n} in {a.get(n)}" + (" (an input with no declared range)" if n in undeclared else "") for n in wide)
        return f"{what} reach(es) 2**24 or beyond"
    if node.op_type == "Mod":
        x, m = a.get(node.input[0]), a.get(node.input[1])
        if x.magnitude() + m.magnitude() > EXACT_LIMIT:
            return f"|dividend| + |divisor| = {x.magnitude() + m.magnitude()} exceeds 2**24 (the product b * floor(a / b) of the lowering)"
    return None


def arithmetic_findings(
    model: onnx.ModelProto, *, inputs: Mapping[str, Range] | None = None, dims: Mapping[str, Range] | None = None
) -> list[ArithmeticFinding]:
    """The integer arithmetic nodes of ``model``'s main graph not proven inside ``(-2**24, 2**24)``
    (module docstring); empty when every one is proven."""
    stated_inputs, stated_dims = declared_ranges(model)
    a = _Analysis(model, stated_inputs if inputs is None else inputs, stated_dims if dims is None else dims)
    a.run()
    found = []
    for index, node in enumerate(a.graph.node):
        if node.op_type not in ARITHMETIC or not any(a.is_int(o) for o in node.output if o):
            continue
        problem = _problem(node, a)
        if problem is not None:
            severity = "error" if node.op_type in DIVISION else "warning"
            found.append(ArithmeticFinding(node.name or f"#{index}", node.op_type, problem, severity))
    return found


# -- transfer functions of single ops ------------------------------------------------------

_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Sum", "Neg", "Abs", "Max", "Min", "Where"})
_PASS_THROUGH = frozenset({
    "Identity", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Tile", "Transpose", "Flatten", "Slice", "Gather",
    "GatherElements", "GatherND", "ReduceMax", "ReduceMin", "DepthToSpace", "SpaceToDepth", "ReverseSequence", "Split",
})
"""Ops whose integer outputs take their values from their first input."""


def _constant(attrs: dict) -> Interval | None:
    t = attrs.get("value")
    if isinstance(t, onnx.TensorProto) and t.data_type in INT_TYPES:
        return _of_array(numpy_helper.to_array(t))
    if "value_int" in attrs:
        return Interval(int(attrs["value_int"]), int(attrs["value_int"]))
    if "value_ints" in attrs:
        return _of_array(np.asarray(attrs["value_ints"], np.int64))
    return None


def _arithmetic(op: str, ins: list[Interval | None]) -> Interval | None:
    """Add, Sub, Mul, Sum, Neg, Abs, Max, Min and Where (its two value inputs)."""
    if op == "Where":
        x, y = ins[1], ins[2]
        return x.union(y) if x is not None and y is not None else None
    if not ins or any(x is None for x in ins):
        return None
    if op == "Neg":
        return Interval(-ins[0].hi, -ins[0].lo)
    if op == "Abs":
        a = ins[0]
        return Interval(0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi)), a.magnitude())
    if op in ("Max", "Min"):
        pick = max if op == "Max" else min
        return Interval(pick(x.lo for x in ins), pick(x.hi for x in ins))
    acc = ins[0]
    for b in ins[1:]:
        if op in ("Add", "Sum"):
            acc = Interval(acc.lo + b.lo, acc.hi + b.hi)
        elif op == "Sub":
            acc = Interval(acc.lo - b.hi, acc.hi - b.lo)
        else:
            corners = [acc.lo * b.lo, acc.lo * b.hi, acc.hi * b.lo, acc.hi * b.hi]
            acc = Interval(min(corners), max(corners))
    return acc


def _division(op: str, ins: list[Interval | None], attrs: dict) -> Interval | None:
    """Div (truncating) and Mod (fmod or the sign of the divisor); None when the divisor may be 0."""
    if len(ins) < 2 or ins[0] is None or ins[1] is None:
        return None
    a, b = ins[0], ins[1]
    if b.lo <= 0 <= b.hi:
        return None
    if op == "Div":
        qs = [_trunc_div(x, y) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        return Interval(min(qs), max(qs))
    if attrs.get("fmod", 0):
        m = min(b.magnitude() - 1, a.magnitude())
        return Interval(-m if a.lo < 0 else 0, m if a.hi > 0 else 0)
    if b.lo > 0:
        return a if 0 <= a.lo and a.hi < b.lo else Interval(0, b.hi - 1)
    return a if b.hi < a.lo and a.hi <= 0 else Interval(b.lo + 1, 0)


def _range(ins: list[Interval | None]) -> Interval | None:
    if len(ins) < 3 or any(x is None for x in ins[:3]):
        return None
    start, limit, delta = ins[0], ins[1], ins[2]
    if delta.lo > 0:
        return Interval(start.lo, max(start.hi, limit.hi - 1))
    if delta.hi < 0:
        return Interval(min(start.lo, limit.lo + 1), start.hi)
    return None

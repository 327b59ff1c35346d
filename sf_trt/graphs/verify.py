"""The verify-and-sample graph: one token per logit row, and whether it is the draft.

``build_verify_graph(vocab, top_k_limit)`` returns the ONNX graph the fake runs on
onnxruntime and ``sf-trt build`` turns into a TensorRT engine (always fp32);
``build_greedy_graph(vocab)`` is its greedy-only twin with the same inputs and
outputs, for batches with no Gumbel row. ``reference_verify_sample`` is a numpy
model of the same sampler, for tests only.

Inputs (``rows`` is the one dynamic dim, the vocabulary ``V`` is static):

==============  =======  ========  =====================================================
name            dtype    shape     meaning
==============  =======  ========  =====================================================
``logits``      float32  [R, V]    the rows' logits
``mode``        int64    [R]       0 greedy, 1 Gumbel (:class:`sf_trt.abi.Sampling`)
``temperature`` float32  [R]       > 0 on Gumbel rows (read only there)
``top_p``       float32  [R]       in (0, 1]; >= 1 keeps every token
``top_k``       int64    [R]       0: off; else keep the tokens >= the k-th largest
``rng_key``     int64    [R]       the lane's ``rng_counter_base``, 0 <= key < 2**63
``position``    int64    [R]       position of the token drawn, 0 <= position < 2**31
``draft``       int64    [R]       the draft token at that position, or -1
==============  =======  ========  =====================================================

Outputs: ``tokens`` int64 ``[R]``, ``match`` bool ``[R]`` (``tokens == draft``).

Semantics, per row (nothing mixes rows, so a row's token never depends on the batch):

* greedy: ``ArgMax(logits)``, the lowest id winning ties;
* Gumbel: ``s = logits / temperature``; top-k keeps ``s >= kth`` (the k-th largest
  ``s``, ties kept); top-p on the kept tokens' softmax ``p`` keeps ``s >= lo``,
  where ``lo`` comes from :data:`BISECT_STEPS` bisection steps over
  ``[max(kth, m - BISECT_SPAN), m]`` (``m`` the largest ``s``) that keep
  ``mass(s >= lo) >= top_p``; ``top_p >= 1`` keeps everything (an explicit ``Or``);
  the argmax is always kept (``lo <= m``). The token is the argmax over kept tokens
  of ``s + g``, ``g = -log(-log(u))``, ``u`` from the integer hash below.

Why ``m - BISECT_SPAN`` bounds the bracket: a token with ``s < m - D`` has
probability below ``exp(-D)``, so all of them together hold less than
``V * exp(-D)``; with ``D = 48`` that is below ``2**-24`` (the gap between 1 and
the largest float32 ``top_p`` below it) for any ``V < 2**45``, so the nucleus never
needs them, and the bracket is at most 48 wide: 24 halvings leave it under 3e-6.

The hash (int64 ``Mul``/``Add``/``Sub``/``Mod``/exact ``Div`` by a power of two; no
bitwise or shift op). ``P = 2**31 - 1``. Every factor is reduced below ``2**31``
before it is multiplied, so every product is below ``2**62``, every sum below
``2**62 + 2**32``, and the one larger intermediate is ``key - (key mod 2**30) <=
key < 2**63`` (:func:`hash_bounds` proves all of it by interval arithmetic; the
tests rerun the steps over extreme inputs in Python ints):

* ``mix(x) = x**5 mod P`` (three squarings/multiplies, each reduced mod P;
  ``gcd(5, P - 1) = 1``, so it permutes ``[0, P)``) is the nonlinear step;
* ``absorb(h, v) = mix((h * A + v + C) mod P)``: ``h < P``, ``A < P``,
  ``v < 2**31``, ``C < 2**31``, so ``h * A + v + C < 2**62 + 2**32``;
* per row, on ``[R, 1]``: the key is split exactly into 30/30/3-bit limbs
  (``Mod 2**30`` and exact ``Div`` of ``key - (key mod 2**30)``), which two
  independent absorb chains (62 bits of state) take with the position, giving
  ``x, y`` in ``[0, 2**30)``;
* per token, on ``[1, V]`` (constant: folded at session/engine build time): two
  absorb chains of the token id give ``t1, t2`` in ``[0, 2**30)``;
* per (row, token), on ``[R, V]``: ``w = ((x + t1) * (y + t2)) mod P`` (factors
  ``< 2**31``, product ``< 2**62``), ``h = w mod 2**23``, and
  ``u = (h + 0.5) * 2**-23 = (2h + 1) / 2**24`` in float32: 24 significant bits, so
  ``u`` is exact and ``2**-24 <= u <= 1 - 2**-24`` (with 24 hash bits ``(h + 0.5) /
  2**24`` would need 25 bits and could round to 1.0, making ``g`` infinite).

Layout. ``V`` is padded with ``-inf`` logits to a multiple of :data:`PAD_TO` (16)
when it is not one. onnxruntime's CPU kernels (Eigen) compute the unaligned head
and the tail of a tensor on a scalar path that can differ from the vector path
by an ulp (``Log`` does); with every row a whole number of 64-byte blocks, each
row's elements take the same path wherever the row sits in the batch. Padded
tokens score ``-inf`` and never win.

Cost. Greedy-only batches should run :func:`build_greedy_graph`. For Gumbel
batches the ``top_k=False`` / ``top_p=False`` variants drop the TopK / the
bisection (24 passes over ``[R, Vp]``, most of the cost on a CPU); they draw exactly
what the full graph draws on rows with ``top_k = 0`` / ``top_p >= 1``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..abi import Sampling
from .builder import OPSET

__all__ = [
    "OPSET", "ROWS", "LOGITS", "SAMPLE_INPUTS", "INPUTS", "TOKENS", "MATCH", "OUTPUTS",
    "GREEDY", "GUMBEL", "TOPK_MAX_K", "PAD_TO", "BISECT_STEPS", "BISECT_SPAN",
    "HASH_P", "U_BITS", "DEBUG_OUTPUTS",
    "build_verify_graph", "build_greedy_graph", "padded_vocab", "topk_k",
    "hash_u", "hash_bounds", "hash_intermediates", "reference_verify_sample",
]

ROWS = "rows"
"""The dynamic dim's name (a role in :data:`sf_trt.formats.shapes.DIM_ROLES`)."""
LOGITS = "logits"
SAMPLE_INPUTS = ("mode", "temperature", "top_p", "top_k", "rng_key", "position", "draft")
"""The other inputs, named as the :class:`sf_trt.primitives.SampleRows` fields."""
INPUTS = (LOGITS,) + SAMPLE_INPUTS
TOKENS, MATCH = "tokens", "match"
OUTPUTS = (TOKENS, MATCH)
DEBUG_OUTPUTS = ("u", "keep", "lo")
"""Extra outputs of ``build_verify_graph(..., debug=True)``: ``u`` float32 ``[R, Vp]``,
``keep`` bool ``[R, Vp]`` (the candidate set of a Gumbel row), ``lo`` float32 ``[R, 1]``."""
GREEDY, GUMBEL = int(Sampling.GPU_GREEDY), int(Sampling.GPU_GUMBEL)
TOPK_MAX_K = 3840
"""TensorRT's TopK takes ``K < 3840`` (its ONNX parser's TopK importer); stated here, where the
graph is built, and checked by ``sf_trt.export.trt_support`` too."""
PAD_TO = 16
BISECT_STEPS = 24
BISECT_SPAN = 48.0
HASH_P = 2**31 - 1
U_BITS = 23

_INPUT_TYPES = {
    "logits": TensorProto.FLOAT, "mode": TensorProto.INT64, "temperature": TensorProto.FLOAT,
    "top_p": TensorProto.FLOAT, "top_k": TensorProto.INT64, "rng_key": TensorProto.INT64,
    "position": TensorProto.INT64, "draft": TensorProto.INT64,
}


def padded_vocab(vocab: int) -> int:
    """``vocab`` rounded up to a multiple of :data:`PAD_TO`."""
    return -(-vocab // PAD_TO) * PAD_TO


def topk_k(vocab: int, top_k_limit: int) -> int:
    """The static K of the graph's TopK."""
    return min(vocab, top_k_limit)


# -- the hash, written once over abstract integer ops ------------------------------------------
#
# ``_row_part``, ``_token_part`` and ``_combine`` run on three backends: numpy int64
# arrays (the reference), Python ints with every intermediate recorded (the bound
# test), intervals (the bound proof), and ONNX nodes (the graph).

_MOD30, _MOD31 = 2**30, 2**31
# (A, C) pairs of the absorb steps: A in [2, P), C in [0, 2**31). Arbitrary odd-looking constants.
_ROW_CHAIN_1 = ((1103515245, 12345), (1664525, 1013904223), (69069, 362437), (48271, 1234567), (16807, 7654321))
_ROW_CHAIN_2 = ((2147001325, 715827883), (1812433253, 87654321), (950706376, 2005050505), (742938285, 31337), (1583458089, 99991))
_TOK_CHAIN_1 = ((397204094, 1597334677), (1540315826, 40503))
_TOK_CHAIN_2 = ((1996161800, 1220703125), (1343714438, 1460021))
_SEEDS = (0x2545F491 % HASH_P, 0x61C88647 % HASH_P, 0x3C6EF372 % HASH_P, 0x1B873593 % HASH_P)


def _mix(o, x):
    """``x**5 mod P``: ``x < P`` so each product is below ``P**2 < 2**62``."""
    x2 = o.mod(o.mul(x, x), HASH_P)
    x4 = o.mod(o.mul(x2, x2), HASH_P)
    return o.mod(o.mul(x4, x), HASH_P)


def _absorb(o, h, v, ac):
    """``mix((h * A + v + C) mod P)``; ``h < P``, ``v < 2**31``: the sum is below ``2**62 + 2**32``."""
    a, c = ac
    return _mix(o, o.mod(o.add(o.add(o.mul(h, o.const(a)), v), o.const(c)), HASH_P))


def _row_part(o, key, pos):
    """(key, position) -> (x, y), each in ``[0, 2**30)``. Shapes: ``[R, 1]``."""
    k0 = o.mod(key, _MOD30)  # [0, 2**30)
    q = o.div_exact(o.sub(key, k0), _MOD30)  # floor(key / 2**30), exact: in [0, 2**33)
    k1 = o.mod(q, _MOD30)  # [0, 2**30)
    k2 = o.div_exact(o.sub(q, k1), _MOD30)  # floor(key / 2**60): [0, 8)
    p = o.mod(pos, _MOD31)  # [0, 2**31) (a no-op on valid input; keeps the bound for any int64)
    outs = []
    for seed, chain in ((_SEEDS[0], _ROW_CHAIN_1), (_SEEDS[1], _ROW_CHAIN_2)):
        h = o.const(seed)
        for v, ac in zip((k0, k1, k2, p), chain):
            h = _absorb(o, h, v, ac)
        h = _absorb(o, h, o.const(0), chain[4])
        outs.append(o.mod(h, _MOD30))
    return outs[0], outs[1]


def _token_part(o, tok):
    """token id (``0 <= tok < 2**31``) -> (t1, t2), each in ``[0, 2**30)``. Shapes: ``[1, V]``."""
    outs = []
    for seed, chain in ((_SEEDS[2], _TOK_CHAIN_1), (_SEEDS[3], _TOK_CHAIN_2)):
        h = _absorb(o, o.const(seed), tok, chain[0])
        h = _absorb(o, h, o.const(0), chain[1])
        outs.append(o.mod(h, _MOD30))
    return outs[0], outs[1]


def _combine(o, x, y, t1, t2):
    """``((x + t1) * (y + t2)) mod P mod 2**23``: factors below ``2**31``, product below ``2**62``.
    Shapes: ``[R, 1]`` and ``[1, V]`` broadcast to ``[R, V]``."""
    w = o.mod(o.mul(o.add(x, t1), o.add(y, t2)), HASH_P)
    return o.mod(w, 2**U_BITS)


class _NumpyOps:
    """int64 numpy arrays (the bounds proven by :func:`hash_bounds` rule out wrap-around)."""

    def const(self, v):
        return np.int64(v)

    def add(self, a, b):
        return np.add(a, b, dtype=np.int64)

    def sub(self, a, b):
        return np.subtract(a, b, dtype=np.int64)

    def mul(self, a, b):
        return np.multiply(a, b, dtype=np.int64)

    def mod(self, a, m):
        return np.mod(a, np.int64(m))  # sign of the divisor, as ONNX Mod with fmod=0

    def div_exact(self, a, d):
        return np.floor_divide(a, np.int64(d))


class _IntOps:
    """Python ints; every intermediate value is appended to ``seen``."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def _r(self, v: int) -> int:
        self.seen.append(v)
        return v

    def const(self, v):
        return self._r(int(v))

    def add(self, a, b):
        return self._r(a + b)

    def sub(self, a, b):
        return self._r(a - b)

    def mul(self, a, b):
        return self._r(a * b)

    def mod(self, a, m):
        return self._r(a % m)

    def div_exact(self, a, d):
        assert a % d == 0
        return self._r(a // d)


@dataclasses.dataclass(frozen=True)
class _Iv:
    lo: int
    hi: int


class _BoundOps:
    """Intervals: every op's result range, for all inputs in the input ranges."""

    def __init__(self) -> None:
        self.lo, self.hi, self.max_product = 0, 0, 0

    def _r(self, lo: int, hi: int) -> _Iv:
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        return _Iv(lo, hi)

    @staticmethod
    def input(lo: int, hi: int) -> _Iv:
        return _Iv(lo, hi)

    def const(self, v):
        return self._r(int(v), int(v))

    def add(self, a, b):
        return self._r(a.lo + b.lo, a.hi + b.hi)

    def sub(self, a, b):
        return self._r(a.lo - b.hi, a.hi - b.lo)

    def mul(self, a, b):
        p = (a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)
        self.max_product = max(self.max_product, max(abs(v) for v in p))
        return self._r(min(p), max(p))

    def mod(self, a, m):
        if 0 <= a.lo and a.hi < m:
            return self._r(a.lo, a.hi)
        return self._r(0, m - 1)

    def div_exact(self, a, d):
        return self._r(a.lo // d, a.hi // d)


def hash_bounds(vocab: int = 2**30) -> tuple[int, int, int]:
    """``(min, max, max |product|)`` over every intermediate of the hash, for every key in
    ``[0, 2**63)``, every int64 position and every token id below ``padded_vocab(vocab)``.

    The max is ``2**63 - 1``: ``key - (key mod 2**30)`` for the largest key, a value no
    larger than the key itself; products stay below ``2**62``, the sums of ``absorb``
    below ``2**62 + 2**32``."""
    o = _BoundOps()
    key, pos = o.input(0, 2**63 - 1), o.input(-(2**63), 2**63 - 1)
    tok = o.input(0, padded_vocab(vocab) - 1)
    x, y = _row_part(o, key, pos)
    t1, t2 = _token_part(o, tok)
    _combine(o, x, y, t1, t2)
    return o.lo, o.hi, o.max_product


def hash_intermediates(key: int, position: int, token: int) -> tuple[int, list[int]]:
    """The hash of one (key, position, token) in Python ints: ``(h, every intermediate)``."""
    o = _IntOps()
    x, y = _row_part(o, key, position)
    t1, t2 = _token_part(o, token)
    return _combine(o, x, y, t1, t2), o.seen


def hash_u(rng_key: np.ndarray, position: np.ndarray, vocab: int) -> np.ndarray:
    """The graph's ``u`` in numpy: float64 ``[R, vocab]``, each value exactly the float32 the
    graph computes."""
    o = _NumpyOps()
    key = np.asarray(rng_key, np.int64).reshape(-1, 1)
    pos = np.asarray(position, np.int64).reshape(-1, 1)
    tok = np.arange(vocab, dtype=np.int64).reshape(1, -1)
    x, y = _row_part(o, key, pos)
    t1, t2 = _token_part(o, tok)
    h = _combine(o, x, y, t1, t2)
    return (h.astype(np.float64) + 0.5) * 2.0**-U_BITS


# -- the graph ---------------------------------------------------------------------------------


class _Builder:
    """Nodes and initializers, with unique names; also the hash ops on ONNX tensors."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0
        self._consts: dict[tuple, str] = {}

    def fresh(self, stem: str) -> str:
        self._n += 1
        return f"{stem}_{self._n}"

    def init(self, value: Any, stem: str = "c") -> str:
        arr = np.asarray(value)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            name = self.fresh(stem)
            self.inits.append(numpy_helper.from_array(arr, name))
            self._consts[key] = name
        return self._consts[key]

    def op(self, op: str, inputs: list[str], stem: str | None = None, n_out: int = 1, **attrs):
        outs = [self.fresh(stem or op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=outs[0], **attrs))
        return outs[0] if n_out == 1 else outs

    def named(self, op: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    # hash ops (all int64; scalars are initializers that broadcast)
    def const(self, v):
        return self.init(np.array(v, np.int64), "k")

    def add(self, a, b):
        return self.op("Add", [a, b], "h_add")

    def sub(self, a, b):
        return self.op("Sub", [a, b], "h_sub")

    def mul(self, a, b):
        return self.op("Mul", [a, b], "h_mul")

    def mod(self, a, m):
        return self.op("Mod", [a, self.const(m)], "h_mod", fmod=0)

    def div_exact(self, a, d):
        return self.op("Div", [a, self.const(d)], "h_div")


def _io(vocab: int) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    inputs = [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, [ROWS, vocab])]
    inputs += [helper.make_tensor_value_info(n, _INPUT_TYPES[n], [ROWS]) for n in SAMPLE_INPUTS]
    outputs = [
        helper.make_tensor_value_info(TOKENS, TensorProto.INT64, [ROWS]),
        helper.make_tensor_value_info(MATCH, TensorProto.BOOL, [ROWS]),
    ]
    return inputs, outputs


def _check_vocab(fn: str, vocab: int) -> None:
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or not 1 <= vocab <= 2**30:
        raise ValueError(f"{fn}: vocab must be an int in 1..2**30 (got {vocab!r})")


def build_greedy_graph(vocab: int) -> onnx.ModelProto:
    """The greedy-only twin of :func:`build_verify_graph`: same inputs and outputs, every row
    greedy. ``tokens = ArgMax(logits)`` ``[R]`` (lowest id on ties), ``match = tokens == draft``
    ``[R]``: the very ArgMax the full graph runs on its greedy rows, so the tokens are identical."""
    _check_vocab("build_greedy_graph", vocab)
    b = _Builder()
    tok = b.named("ArgMax", [LOGITS], TOKENS, axis=1, keepdims=0, select_last_index=0)  # [R]
    b.named("Equal", [tok, "draft"], MATCH)  # [R]
    inputs, outputs = _io(vocab)
    graph = helper.make_graph(b.nodes, "verify_greedy", inputs, outputs, b.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sf_trt.graphs.verify")


def build_verify_graph(
    vocab: int, top_k_limit: int = 1024, *, top_k: bool = True, top_p: bool = True, debug: bool = False
) -> onnx.ModelProto:
    """The verify-and-sample graph (module docstring: inputs, outputs, semantics, bounds).

    ``top_k_limit`` is the largest ``top_k`` a row may ask for; the TopK's static K is
    ``min(vocab, top_k_limit)`` and must stay below 3840 (TensorRT).

    ``top_k=False`` / ``top_p=False`` leave out the TopK / the bisection: such a graph
    treats every row as ``top_k = 0`` / ``top_p = 1``, and on rows that are so it draws
    bit-for-bit what the full graph draws (the same ops on the same values; the tests
    check it), so a runner may pick the cheapest variant that covers a batch.
    ``debug=True`` adds the outputs :data:`DEBUG_OUTPUTS`, for tests.
    """
    _check_vocab("build_verify_graph", vocab)
    if isinstance(top_k_limit, bool) or not isinstance(top_k_limit, (int, np.integer)) or top_k_limit < 1:
        raise ValueError(f"build_verify_graph: top_k_limit must be an int >= 1 (got {top_k_limit!r})")
    if top_k_limit >= TOPK_MAX_K:
        raise ValueError(
            f"build_verify_graph: top_k_limit {top_k_limit} must be below {TOPK_MAX_K} (TensorRT's TopK bound on K)"
        )
    V, Vp, K = int(vocab), padded_vocab(int(vocab)), topk_k(int(vocab), int(top_k_limit))
    b = _Builder()
    f32 = lambda v: b.init(np.array(v, np.float32), "f")  # noqa: E731
    i64 = lambda v: b.init(np.array(v, np.int64), "i")  # noqa: E731
    axis1 = b.init(np.array([1], np.int64), "axis1")
    col = lambda x: b.op("Unsqueeze", [x, axis1], "col")  # noqa: E731  [R] -> [R, 1]
    as_f32 = lambda x: b.op("Cast", [x], "mask", to=TensorProto.FLOAT)  # noqa: E731  bool -> 0.0 / 1.0
    # (masks multiply as 0.0/1.0 floats: exact on the finite, >= 0 values they scale, and
    # onnxruntime's Mul is several times faster than its Where)

    # Greedy: the same ArgMax as build_greedy_graph.
    greedy = b.op("ArgMax", [LOGITS], "greedy", axis=1, keepdims=0, select_last_index=0)  # [R]

    # Per-row parameters as columns [R, 1].
    is_gumbel = b.op("Equal", ["mode", i64(GUMBEL)], "is_gumbel")  # [R] bool
    temp = b.op("Where", [col(is_gumbel), col("temperature"), f32(1.0)], "temp")  # [R, 1]: 1 on greedy rows

    # Scaled logits s [R, Vp] (padded with -inf to a multiple of PAD_TO).
    x = LOGITS
    if Vp != V:
        pads = b.init(np.array([0, 0, 0, Vp - V], np.int64), "pads")
        x = b.op("Pad", [LOGITS, pads, f32(-np.inf)], "padded", mode="constant")  # [R, Vp]
    s = b.op("Div", [x, temp], "s")  # [R, Vp]

    keep = None  # [R, Vp] bool, the candidates; None: every token
    if top_k:
        # Top-k: keep s >= the k-th largest s (ties kept); off where top_k <= 0.
        kcol = col("top_k")  # [R, 1]
        vals, _ = b.op("TopK", [s, b.init(np.array([K], np.int64), "K")], "topk", n_out=2, axis=1, largest=1, sorted=1)  # [R, K]
        kidx = b.op("Min", [b.op("Max", [b.op("Sub", [kcol, i64(1)]), i64(0)]), i64(K - 1)], "kidx")  # [R, 1] in 0..K-1
        kth = b.op("GatherElements", [vals, kidx], "kth", axis=1)  # [R, 1]
        k_on = b.op("Greater", [kcol, i64(0)], "k_on")  # [R, 1]
        keep = b.op("Or", [b.op("GreaterOrEqual", [s, kth]), b.op("Not", [k_on])], "keep_k")  # [R, Vp]
        m = b.op("Slice", [vals, i64([0]), i64([1]), axis1], "m")  # [R, 1]: the largest s
    else:
        m = b.op("ReduceMax", [s], "m", axes=[1], keepdims=1)  # [R, 1]: the largest s

    lo = None
    if top_p:
        # Top-p over the top-k-filtered softmax: e = exp(s - m) on kept tokens, 0 elsewhere.
        pcol = col("top_p")  # [R, 1]
        e = b.op("Exp", [b.op("Sub", [s, m])], "e")  # [R, Vp], in [0, 1] (0 on the -inf padding)
        if keep is not None:
            e = b.op("Mul", [e, as_f32(keep)], "e_k")  # [R, Vp]
        z = b.op("ReduceSum", [e, axis1], "z", keepdims=1)  # [R, 1], >= 1 (the argmax's e is 1)
        target = b.op("Mul", [pcol, z], "target")  # [R, 1]: keep lo with mass(s >= lo) >= top_p * Z
        floor = b.op("Sub", [m, f32(BISECT_SPAN)], "floor")  # [R, 1]
        lo = b.op("Max", [b.op("Where", [k_on, kth, f32(-np.inf)]), floor], "lo") if top_k else floor  # [R, 1]
        hi = m  # [R, 1]
        half = f32(0.5)
        for _ in range(BISECT_STEPS):
            mid = b.op("Add", [b.op("Mul", [lo, half]), b.op("Mul", [hi, half])], "mid")  # [R, 1]; lo <= mid <= hi
            above = as_f32(b.op("GreaterOrEqual", [s, mid], "above"))  # [R, Vp]
            mass = b.op("ReduceSum", [b.op("Mul", [e, above]), axis1], "mass", keepdims=1)  # [R, 1]
            ok = b.op("GreaterOrEqual", [mass, target], "ok")  # [R, 1]
            lo = b.op("Where", [ok, mid, lo], "lo")  # [R, 1]
            hi = b.op("Where", [ok, hi, mid], "hi")  # [R, 1]
        p_off = b.op("GreaterOrEqual", [pcol, f32(1.0)], "p_off")  # [R, 1]: top_p >= 1 keeps everything
        keep_p = b.op("Or", [b.op("GreaterOrEqual", [s, lo]), p_off], "keep_p")  # [R, Vp]; lo <= m: the argmax stays
        keep = keep_p if keep is None else b.op("And", [keep, keep_p], "keep")  # [R, Vp]

    # u from the hash: per row on [R, 1], per token on [1, Vp] (constant), combined on [R, Vp].
    rx, ry = _row_part(b, col("rng_key"), col("position"))  # [R, 1] each, in [0, 2**30)
    tok_ids = b.init(np.arange(Vp, dtype=np.int64).reshape(1, Vp), "token_ids")  # [1, Vp]
    t1, t2 = _token_part(b, tok_ids)  # [1, Vp] each, in [0, 2**30)
    h = _combine(b, rx, ry, t1, t2)  # [R, Vp] int64 in [0, 2**23)
    hf = b.op("Cast", [h], "hf", to=TensorProto.FLOAT)  # [R, Vp], exact (< 2**24)
    u = b.op("Mul", [b.op("Add", [hf, f32(0.5)]), f32(2.0**-U_BITS)], "u")  # [R, Vp], exact, in [2**-24, 1 - 2**-24]
    loglog = b.op("Log", [b.op("Neg", [b.op("Log", [u])])], "loglog")  # [R, Vp]: log(-log u) = -g, finite
    score = b.op("Sub", [s, loglog], "score")  # [R, Vp]: s + g
    if keep is not None:
        score = b.op("Where", [keep, score, f32(-np.inf)], "score_kept")  # [R, Vp]: -inf off the candidates
    gumbel = b.op("ArgMax", [score], "gumbel", axis=1, keepdims=0, select_last_index=0)  # [R]

    tokens = b.named("Where", [is_gumbel, gumbel, greedy], TOKENS)  # [R]
    b.named("Equal", [tokens, "draft"], MATCH)  # [R]
    inputs, outputs = _io(V)
    if debug:
        if keep is None:
            keep = b.op("Equal", [s, s], "all")  # [R, Vp]: True but on NaN
        if lo is None:
            lo = b.op("Sub", [m, f32(np.inf)], "no_lo")  # [R, 1]: -inf
        for name, value in zip(DEBUG_OUTPUTS, (u, keep, lo)):
            b.named("Identity", [value], name)
        outputs += [
            helper.make_tensor_value_info("u", TensorProto.FLOAT, [ROWS, Vp]),
            helper.make_tensor_value_info("keep", TensorProto.BOOL, [ROWS, Vp]),
            helper.make_tensor_value_info("lo", TensorProto.FLOAT, [ROWS, 1]),
        ]
    graph = helper.make_graph(b.nodes, "verify", inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sf_trt.graphs.verify")
    model.metadata_props.add(key="top_k_limit", value=str(int(top_k_limit)))
    return model


# -- the numpy reference (tests only) ----------------------------------------------------------


def reference_verify_sample(
    logits: np.ndarray,
    mode: np.ndarray,
    temperature: np.ndarray,
    top_p: np.ndarray,
    top_k: np.ndarray,
    rng_key: np.ndarray,
    position: np.ndarray,
    draft: np.ndarray,
    *,
    top_k_limit: int = 1024,
    details: bool = False,
):
    """The sampler in numpy: ``(tokens [R] int64, match [R] bool)``.

    ``s`` is computed in float32 (bit-identical to the graph's ``Div``), ``u`` exactly as
    the graph's; the softmax, the bisection and ``g`` run in float64, so a row whose
    decision is within float32 rounding of a tie or of the top-p threshold may differ from
    the graph. ``details=True`` adds a dict: ``keep`` [R, V], ``lo`` [R], ``s`` [R, V],
    and how close each row is to such a flip: ``score_gap`` [R] (best minus second-best
    kept score), ``lo_gap`` [R] (the lowest ``s`` top-p keeps minus the highest it drops) and
    ``mass_gap`` [R] (distance from ``top_p`` to the nearest cumulative probability of the
    tokens in descending order); the last two are +inf where top-p is off.
    """
    logits = np.asarray(logits, np.float32)
    R, V = logits.shape
    mode = np.asarray(mode, np.int64)
    gum = mode == GUMBEL
    temp = np.where(gum, np.asarray(temperature, np.float32), np.float32(1.0)).astype(np.float32)
    s = (logits / temp[:, None]).astype(np.float64)  # float32 division, then widened
    K = topk_k(V, top_k_limit)
    top_k = np.asarray(top_k, np.int64)
    vals = -np.sort(-s, axis=1)[:, :K]
    kidx = np.clip(top_k - 1, 0, K - 1)
    kth = vals[np.arange(R), kidx]
    k_on = top_k > 0
    keep_k = (s >= kth[:, None]) | ~k_on[:, None]
    m = vals[:, 0]
    with np.errstate(under="ignore", invalid="ignore"):
        e = np.where(keep_k, np.exp(s - m[:, None]), 0.0)
    z = e.sum(axis=1)
    tp = np.asarray(top_p, np.float32).astype(np.float64)
    target = tp * z
    lo = np.maximum(np.where(k_on, kth, -np.inf), m - BISECT_SPAN)
    hi = m.copy()
    for _ in range(BISECT_STEPS):
        mid = 0.5 * lo + 0.5 * hi
        mass = np.where(keep_k & (s >= mid[:, None]), e, 0.0).sum(axis=1)
        ok = mass >= target
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    p_off = tp >= 1.0
    keep = keep_k & ((s >= lo[:, None]) | p_off[:, None])
    u = hash_u(rng_key, position, V)
    g = -np.log(-np.log(u))
    score = np.where(keep, s + g, -np.inf)
    tokens = np.where(gum, score.argmax(axis=1), logits.argmax(axis=1)).astype(np.int64)
    match = tokens == np.asarray(draft, np.int64)
    if not details:
        return tokens, match
    top2 = -np.sort(-score, axis=1)[:, :2] if V > 1 else np.concatenate([score, np.full((R, 1), -np.inf)], axis=1)
    with np.errstate(invalid="ignore"):
        score_gap = np.where(np.isfinite(top2[:, 1]), top2[:, 0] - top2[:, 1], np.inf)
        kept_p = keep_k & (s >= lo[:, None])
        dropped_p = keep_k & ~kept_p
        lowest_kept = np.min(np.where(kept_p, s, np.inf), axis=1)
        highest_dropped = np.max(np.where(dropped_p, s, -np.inf), axis=1)
        lo_gap = np.where(p_off, np.inf, lowest_kept - highest_dropped)
        order = np.argsort(-np.where(keep_k, s, -np.inf), axis=1, kind="stable")
        cum = np.cumsum(np.take_along_axis(e, order, axis=1), axis=1) / z[:, None]
        mass_gap = np.where(p_off, np.inf, np.min(np.abs(cum - tp[:, None]), axis=1))
    return tokens, match, {"keep": keep, "lo": lo, "score_gap": score_gap, "lo_gap": lo_gap, "mass_gap": mass_gap, "s": s}

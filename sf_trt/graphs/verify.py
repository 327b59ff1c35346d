"""The verify-and-sample graph: one token per logit row, and whether it is the draft.

``build_verify_graph(vocab, top_k_limit)`` returns the ONNX graph the fake runs on
onnxruntime and ``sf-trt build`` turns into a TensorRT engine (always fp32);
``build_greedy_graph(vocab)`` is its greedy-only twin with the same inputs and
outputs, for batches with no Gumbel row; ``build_candidate_graph(vocab, top_k_limit)``
its nucleus path alone, for onnxruntime ("Cost" below).
:func:`sf_trt.graphs.reference.reference_verify_sample` is a numpy model of the same
sampler, for tests only.

Inputs (``rows`` is the one dynamic dim, the vocabulary ``V`` is static):

==============  =======  ========  =====================================================
name            dtype    shape     meaning
==============  =======  ========  =====================================================
``logits``      float32  [R, V]    the rows' logits
``mode``        int64    [R]       0 greedy, 1 Gumbel (:class:`sf_trt.abi.Sampling`)
``temperature`` float32  [R]       > 0 on Gumbel rows (read only there)
``top_p``       float32  [R]       in (0, 1]; >= 1 keeps every token
``top_k``       int64    [R]       0: off; else keep the tokens >= the k-th largest
``noise_add``   int32    [R, 3]    the row's additive noise keys, each in [0, 4096)
``noise_mul``   int32    [R, 3]    the row's multiplicative noise keys, odd, in [1025, 2047]
``draft``       int64    [R]       the draft token at that position, or -1
``min_p``       float32  [R]       in [0, 1]; 0 keeps every token
==============  =======  ========  =====================================================

The noise keys are :func:`noise_keys` of the row's ``rng_counter_base`` (the lane's,
``0 <= key < 2**63``) and ``position`` (of the token drawn,
``0 <= position < 2**31``), computed on the host in exact 64-bit integer code;
:func:`sample_feeds` turns :class:`sf_trt.primitives.SampleRows` into every input but
``logits``. The graph states their ranges in its metadata (:mod:`sf_trt.graphs.ranges`).

Outputs: ``tokens`` int64 ``[R]``, ``match`` bool ``[R]`` (``tokens == draft``);
:func:`build_candidate_graph` adds ``covered`` bool ``[R]``.

Semantics, per row (nothing mixes rows, so a row's token never depends on the batch):

* greedy: ``ArgMax(logits)``, the lowest id winning ties;
* Gumbel: ``s = logits / temperature``; top-k keeps ``s >= kth`` (the k-th largest
  ``s``, ties kept); min-p keeps ``exp(s - m) >= min_p`` (a token's probability at
  least ``min_p`` times the most likely one's, over the whole vocabulary, as vLLM's
  ``min_p``); top-p on the softmax ``p`` of the tokens both kept keeps ``s >= lo``;
  ``top_p >= 1`` keeps everything (an explicit ``Or``). The token is the argmax over
  kept tokens of ``s + g``, ``g = -log(-log(u))``, ``u`` from the integer hash below,
  the lowest id winning ties. Top-p's ``lo`` comes from one of two paths:

  - **the nucleus path.** The candidates are the ``C = min(V, candidates)`` largest
    ``s`` (:data:`CANDIDATES`, a TopK, descending). ``e_k`` is ``exp(s - m)`` (``m``
    the largest ``s``) on the tokens top-k and min-p keep, 0 elsewhere; ``Z`` its sum
    over the whole vocabulary (one ``ReduceSum``). The running sum of the candidates'
    ``e_k`` in descending order (a float32 ``CumSum``) gives ``lo_p``: the value of the
    first candidate at which it reaches ``top_p * Z``, the last candidate's value if it
    never does. ``lo = max(lo_p, kth)`` over the filters a row has on (``-inf`` with
    neither). The row is **covered** when ``lo`` is above the ``C``-th largest ``s``:
    then every token with ``s >= lo``, ties included, is a candidate, and the draw is
    made over the candidates alone. That is the same draw as over the whole vocabulary:
    no token outside the candidates is kept, a token's ``g`` depends on its id and the
    row's keys only (the candidates' hash states are gathered by id), and the tie rule
    (``ReduceMin`` of the ids with the best score) is the whole-vocabulary ``ArgMax``'s.
  - **the bisection**, on rows not covered (the nucleus reaches past the candidates,
    or neither top-k nor top-p is on): :data:`BISECT_STEPS` bisection steps over
    ``[max(kth, m - BISECT_SPAN), m]`` for the largest ``lo`` that keeps
    ``mass(s >= lo) >= top_p * Z``, and the draw over the whole vocabulary.

  On a covered row top-p is exact: the shortest run of tokens in descending order whose
  mass reaches ``top_p * Z``, every token tied with its last one kept. The bisection
  keeps that set plus any token within its final bracket (under 3e-6) below it. Both
  paths keep the argmax (``lo <= m``).

  Why not cap the nucleus at the candidates (llama.cpp's and TensorRT-LLM's samplers cap
  top-k-then-top-p at a fixed size): a cap would change top-p's distribution on flat
  rows, while the fallback keeps it. With ``C = 256`` the candidates cover the nucleus
  on all but a few rows in a thousand of SmolLM2-135M at temperature 0.8, top-p 0.95
  (docs/benchmarks.md, "The sampler"), so the bisection's cost is rarely paid.

Why ``m - BISECT_SPAN`` bounds the bracket: a token with ``s < m - D`` has
probability below ``exp(-D)``, so all of them together hold less than
``V * exp(-D)``; with ``D = 48`` that is below ``2**-24`` (the gap between 1 and
the largest float32 ``top_p`` below it) for any ``V < 2**45``, so the nucleus never
needs them, and the bracket is at most 48 wide: 24 halvings leave it under 3e-6.

The hash (:mod:`sf_trt.graphs.noise`): every integer an exact ``int32`` below ``2**24``,
on any backend; the row's keys are made on the host (:func:`~sf_trt.graphs.noise.noise_keys`),
each token's state is a constant, and three Feistel rounds on ``[R, Vp]`` give ``u``.

Layout. ``V`` is padded with ``-inf`` logits to a multiple of :data:`PAD_TO` (16)
when it is not one. onnxruntime's CPU kernels (Eigen) compute the unaligned head
and the tail of a tensor on a scalar path that can differ from the vector path
by an ulp (``Log`` does); with every row a whole number of 64-byte blocks, each
row's elements take the same path wherever the row sits in the batch. Padded
tokens score ``-inf`` and never win.

The candidates' Logs run on ``[R, C]`` padded to a multiple of :data:`PAD_TO` (with
``u = 0.5``, then cut off), for the same reason.

Cost. Greedy-only batches should run :func:`build_greedy_graph`. For Gumbel
batches the ``top_k=False`` / ``top_p=False`` / ``min_p=False`` variants drop the
top-k filter / top-p / the min-p filter; they draw exactly what the full graph draws
on rows with ``top_k = 0`` / ``top_p >= 1`` / ``min_p = 0``. The full graph computes
both paths and picks one per row (``Where``), which is what TensorRT runs. On a CPU
the bisection (24 passes over ``[R, Vp]``) and the whole-vocabulary hash and Logs are
most of the cost; the nucleus path reads ``[R, Vp]`` only for the TopK, ``Exp``,
``Z`` and the masks, and hashes ``[R, C]``. :func:`build_candidate_graph` is the
nucleus path alone, with an output saying which rows it covered: onnxruntime's runner
runs it and then the full graph on the uncovered rows only
(:class:`sf_trt.backends.ort_sampler.OrtVerifySampler`). On SmolLM2's ``[9, 49152]``
logits it costs about 1.8 ms against 13 ms for the bisection (docs/benchmarks.md, "The sampler").
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..abi import Sampling
from .builder import OPSET, GraphBuilder
from .noise import LIMB, MAX_VOCAB, MUL_RANGE, ROUNDS, U_BITS, feistel, noise_keys, token_states
from .ranges import declare_ranges

__all__ = [
    "OPSET", "ROWS", "LOGITS", "SAMPLE_FIELDS", "NOISE_ADD", "NOISE_MUL", "SAMPLE_INPUTS", "INPUTS",
    "TOKENS", "MATCH", "OUTPUTS", "COVERED", "GREEDY", "GUMBEL", "TOPK_MAX_K", "PAD_TO", "CANDIDATES", "BISECT_STEPS", "BISECT_SPAN",
    "DEBUG_OUTPUTS",
    "build_verify_graph", "build_candidate_graph", "build_greedy_graph", "padded_vocab", "topk_k",
    "sample_feeds",
]

ROWS = "rows"
"""The dynamic dim's name (a role in :data:`sf_trt.formats.shapes.DIM_ROLES`)."""
LOGITS = "logits"
SAMPLE_FIELDS = ("mode", "temperature", "top_p", "top_k", "draft", "min_p")
"""The inputs fed straight from the :class:`sf_trt.primitives.SampleRows` fields of that name."""
NOISE_ADD, NOISE_MUL = "noise_add", "noise_mul"
"""The inputs :func:`noise_keys` computes from the ``rng_counter_base`` and ``position`` fields."""
SAMPLE_INPUTS = SAMPLE_FIELDS[:4] + (NOISE_ADD, NOISE_MUL) + SAMPLE_FIELDS[4:]
"""Every input but ``logits``, in graph order: what :func:`sample_feeds` returns."""
INPUTS = (LOGITS,) + SAMPLE_INPUTS
TOKENS, MATCH = "tokens", "match"
OUTPUTS = (TOKENS, MATCH)
COVERED = "covered"
"""The extra output of :func:`build_candidate_graph`: bool ``[R]``, the rows whose tokens it drew."""
DEBUG_OUTPUTS = ("u", "keep", "lo")
"""Extra outputs of ``build_verify_graph(..., debug=True)``: ``u`` float32 ``[R, Vp]``,
``keep`` bool ``[R, Vp]`` (the candidate set of a Gumbel row), ``lo`` float32 ``[R, 1]``."""
GREEDY, GUMBEL = int(Sampling.GPU_GREEDY), int(Sampling.GPU_GUMBEL)
TOPK_MAX_K = 3840
"""TensorRT's TopK takes ``K < 3840`` (its ONNX parser's TopK importer); stated here, where the
graph is built, and checked by ``sf_trt.export.trt_support`` too."""
PAD_TO = 16
CANDIDATES = 256
"""How many of a row's largest ``s`` the nucleus path draws from (module docstring, "Cost")."""
BISECT_STEPS = 24
BISECT_SPAN = 48.0

_INPUT_TYPES = {
    "logits": TensorProto.FLOAT, "mode": TensorProto.INT64, "temperature": TensorProto.FLOAT,
    "top_p": TensorProto.FLOAT, "top_k": TensorProto.INT64, NOISE_ADD: TensorProto.INT32,
    NOISE_MUL: TensorProto.INT32, "draft": TensorProto.INT64, "min_p": TensorProto.FLOAT,
}
_NUMPY_TYPES = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64, TensorProto.INT32: np.int32}
_FIELD_DTYPES = tuple((n, _NUMPY_TYPES[_INPUT_TYPES[n]]) for n in SAMPLE_FIELDS)


def padded_vocab(vocab: int) -> int:
    """``vocab`` rounded up to a multiple of :data:`PAD_TO`."""
    return -(-vocab // PAD_TO) * PAD_TO


def topk_k(vocab: int, top_k_limit: int) -> int:
    """The static K of the graph's TopK."""
    return min(vocab, top_k_limit)


def sample_feeds(sample, *, noise: bool = True) -> dict[str, np.ndarray]:
    """Every input of the verify graph but ``logits``, by name and in the graph's dtypes,
    from a :class:`sf_trt.primitives.SampleRows` (or anything with its fields).

    ``noise=False`` fills the noise keys with zeros instead of hashing ``rng_counter_base`` and
    ``position``: for :func:`build_greedy_graph`, which reads neither."""
    feeds = {n: np.ascontiguousarray(getattr(sample, n), dtype=dtype) for n, dtype in _FIELD_DTYPES}
    if noise:
        feeds[NOISE_ADD], feeds[NOISE_MUL] = noise_keys(sample.rng_counter_base, sample.position)
    else:
        feeds[NOISE_ADD] = feeds[NOISE_MUL] = np.zeros((len(feeds["mode"]), ROUNDS), np.int32)
    return feeds  # by name: the order of SAMPLE_INPUTS does not matter to a session


# -- the graph ---------------------------------------------------------------------------------


class _Builder(GraphBuilder):
    """The graph builder with the hash's int32 ops (scalars are initializers that broadcast),
    so :func:`feistel` runs on ONNX tensors as it runs on numpy arrays (:class:`NumpyOps`)."""

    hash_inputs = None  # set by _hash_inputs

    def _i32(self, v):
        return v if isinstance(v, str) else self.init(np.array(v, np.int32))

    def add(self, a, b):
        return self.op("Add", [a, self._i32(b)], "h_add")

    def sub(self, a, b):
        return self.op("Sub", [a, self._i32(b)], "h_sub")

    def mul(self, a, b):
        return self.op("Mul", [a, self._i32(b)], "h_mul")

    def div(self, a, d):
        return self.op("Div", [a, self._i32(d)], "h_div")

    def col(self, x: str) -> str:
        """``[R] -> [R, 1]``."""
        return self.op("Unsqueeze", [x, self.i64([1])], "col")

    def mask(self, x: str) -> str:
        """bool -> 0.0 / 1.0 (masks multiply as floats: exact on the finite, >= 0 values
        they scale, and onnxruntime's Mul is several times faster than its Where)."""
        return self.op("Cast", [x], "mask", to=TensorProto.FLOAT)


def _io(vocab: int) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    inputs = [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, [ROWS, vocab])]
    inputs += [
        helper.make_tensor_value_info(n, _INPUT_TYPES[n], [ROWS, ROUNDS] if n in (NOISE_ADD, NOISE_MUL) else [ROWS])
        for n in SAMPLE_INPUTS
    ]
    outputs = [
        helper.make_tensor_value_info(TOKENS, TensorProto.INT64, [ROWS]),
        helper.make_tensor_value_info(MATCH, TensorProto.BOOL, [ROWS]),
    ]
    return inputs, outputs


def _check_vocab(fn: str, vocab: int) -> None:
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or not 1 <= vocab <= MAX_VOCAB:
        raise ValueError(f"{fn}: vocab must be an int in 1..2**24 (got {vocab!r})")


def _declare_ranges(model: onnx.ModelProto) -> onnx.ModelProto:
    """The noise keys' ranges, which bound every integer the hash computes (sf_trt.graphs.ranges)."""
    return declare_ranges(model, inputs={NOISE_ADD: (0, LIMB - 1), NOISE_MUL: MUL_RANGE})


def build_greedy_graph(vocab: int) -> onnx.ModelProto:
    """The greedy-only twin of :func:`build_verify_graph`: same inputs and outputs, every row
    greedy. ``tokens = ArgMax(logits)`` ``[R]`` (lowest id on ties), ``match = tokens == draft``
    ``[R]``: the very ArgMax the full graph runs on its greedy rows, so the tokens are identical."""
    _check_vocab("build_greedy_graph", vocab)
    b = _Builder()
    tok = b.named("ArgMax", [LOGITS], TOKENS, axis=1, keepdims=0, select_last_index=0)  # [R]
    b.named("Equal", [tok, "draft"], MATCH)  # [R]
    inputs, outputs = _io(vocab)
    return _declare_ranges(b.model("verify_greedy", inputs, outputs, producer="sf_trt.graphs.verify"))


def build_verify_graph(
    vocab: int, top_k_limit: int = 1024, *, top_k: bool = True, top_p: bool = True, min_p: bool = True,
    debug: bool = False, candidates: int = CANDIDATES,
) -> onnx.ModelProto:
    """The verify-and-sample graph (module docstring: inputs, outputs, semantics, bounds).

    ``top_k_limit`` is the largest ``top_k`` a row may ask for; the TopK's static K is
    ``min(vocab, top_k_limit)`` and must stay below 3840 (TensorRT). It is also the
    number of candidates of the nucleus path ("Cost" in the module docstring).

    ``top_k=False`` / ``top_p=False`` / ``min_p=False`` leave out the TopK / the top-p
    threshold / the min-p filter: such a graph treats every row as ``top_k = 0`` /
    ``top_p = 1`` / ``min_p = 0``, and on rows that are so it draws
    bit-for-bit what the full graph draws (the same ops on the same values; the tests
    check it), so a runner may pick the cheapest variant that covers a batch.
    ``debug=True`` adds the outputs :data:`DEBUG_OUTPUTS`, for tests.
    """
    return _build(
        "build_verify_graph", vocab, top_k_limit, candidates, top_k=top_k, top_p=top_p, min_p=min_p, debug=debug, full=True
    )


def build_candidate_graph(
    vocab: int, top_k_limit: int = 1024, *, top_k: bool = True, top_p: bool = True, min_p: bool = True,
    candidates: int = CANDIDATES,
) -> onnx.ModelProto:
    """The nucleus path of :func:`build_verify_graph` alone, for onnxruntime: the same inputs,
    outputs ``tokens``, ``match`` and :data:`COVERED` (bool ``[R]``).

    On a row with ``covered`` true (every greedy row, and every Gumbel row whose kept tokens
    all lie among the TopK candidates) ``tokens`` and ``match`` are bit-for-bit what
    :func:`build_verify_graph` with the same flags gives; on the other rows they mean
    nothing, and a runner draws them with :func:`build_verify_graph`
    (:class:`sf_trt.backends.ort_sampler.OrtVerifySampler` does). ``top_k`` or ``top_p``
    must be on: without them no row can be covered.
    """
    if not (top_k or top_p):
        raise ValueError("build_candidate_graph: needs top_k or top_p (got both False: no row could be covered)")
    return _build(
        "build_candidate_graph", vocab, top_k_limit, candidates, top_k=top_k, top_p=top_p, min_p=min_p, debug=False, full=False
    )


def _check_k(fn: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{fn}: {name} must be an int >= 1 (got {value!r})")
    if value >= TOPK_MAX_K:
        raise ValueError(f"{fn}: {name} {value} must be below {TOPK_MAX_K} (TensorRT's TopK bound on K)")
    return int(value)


def _build(
    fn: str, vocab, top_k_limit, candidates, *, top_k: bool, top_p: bool, min_p: bool, debug: bool, full: bool,
) -> onnx.ModelProto:
    """Both graphs: ``full`` adds the whole-vocabulary path and picks it on rows not covered."""
    _check_vocab(fn, vocab)
    top_k_limit, candidates = _check_k(fn, "top_k_limit", top_k_limit), _check_k(fn, "candidates", candidates)
    V, Vp, K, C = int(vocab), padded_vocab(int(vocab)), topk_k(int(vocab), top_k_limit), topk_k(int(vocab), candidates)
    b = _Builder()
    greedy = b.op("ArgMax", [LOGITS], "greedy", axis=1, keepdims=0, select_last_index=0)  # [R]: build_greedy_graph's
    is_gumbel = b.op("Equal", ["mode", b.i64(GUMBEL)], "is_gumbel")  # [R] bool
    s = _scaled_logits(b, is_gumbel, V, Vp)  # [R, Vp]
    cands = None
    if top_k or top_p:
        width = max(K, C) if top_k else C
        vals, ids = b.op("TopK", [s, b.i64([width])], "topk", n_out=2, axis=1, largest=1, sorted=1)  # [R, width] each
        cands = (vals, ids) if width == C else tuple(b.op("Slice", [x, b.i64([0]), b.i64([C]), b.i64([1])], "cand") for x in (vals, ids))
        m = b.op("Slice", [vals, b.i64([0]), b.i64([1]), b.i64([1])], "m")  # [R, 1]: the largest s
    else:
        m = b.op("ReduceMax", [s], "m", axes=[1], keepdims=1)  # [R, 1]
    keep, kth_on = _top_k_filter(b, s, vals, K) if top_k else (None, None)
    e = b.op("Exp", [b.op("Sub", [s, m])], "e") if (min_p or top_p) else None  # [R, Vp]: exp(s - m) in [0, 1]; 1 at the argmax
    if min_p:
        # Min-p: keep p / p_max = exp(s - m) >= min_p, compared on the [R, Vp] values (no
        # per-row Log: a transcendental on an [R, 1] column could round by where the row sits).
        keep_m = b.op("GreaterOrEqual", [e, b.col("min_p")], "keep_m")  # [R, Vp]; min_p = 0 keeps all
        keep = keep_m if keep is None else b.op("And", [keep, keep_m], "keep_km")
    mass = _top_p_mass(b, e, keep) if top_p else None  # (e on kept tokens [R, Vp], top_p * Z [R, 1])
    tokens_at = {}
    if cands is not None:
        tokens_at["cand"], covered, lo_cand = _candidate_draw(b, m, cands, keep, kth_on, mass, C, Vp)
    if full:
        keep_full, lo = keep, None
        if top_p:
            keep_full, lo = _top_p_bisect(b, s, m, keep, kth_on, mass)
        tokens_at["full"], u = _gumbel_argmax(b, s, keep_full, Vp)  # [R], [R, Vp]
        debug_keep_lo = (keep_full, lo)
    if full and cands is not None:
        gumbel = b.op("Where", [b.op("Squeeze", [covered, b.i64([1])], "covered_r"), tokens_at["cand"], tokens_at["full"]], "gumbel")
    else:
        gumbel = tokens_at["full" if full else "cand"]
    tokens = b.named("Where", [is_gumbel, gumbel, greedy], TOKENS)  # [R]
    b.named("Equal", [tokens, "draft"], MATCH)  # [R]
    inputs, outputs = _io(V)
    if not full:
        b.named("Or", [b.op("Not", [is_gumbel]), b.op("Squeeze", [covered, b.i64([1])], "covered_r")], COVERED)  # [R]
        outputs.append(helper.make_tensor_value_info(COVERED, TensorProto.BOOL, [ROWS]))
    if debug:
        keep_dbg, lo_dbg = debug_keep_lo
        if cands is not None:
            keep_dbg, lo_dbg = _picked_debug(b, s, m, covered, lo_cand, keep, keep_dbg, lo_dbg)
        outputs += _debug_outputs(b, s, m, u, keep_dbg, lo_dbg, Vp)
    name = "verify" if full else "verify_candidates"
    metadata = {"top_k_limit": top_k_limit, "candidates": candidates}
    model = b.model(name, inputs, outputs, producer="sf_trt.graphs.verify", metadata=metadata)
    return _declare_ranges(model)


def _scaled_logits(b: _Builder, is_gumbel: str, V: int, Vp: int) -> str:
    """``s = logits / temperature`` ``[R, Vp]`` (temperature 1 on greedy rows), padded
    with -inf to ``Vp``, a multiple of PAD_TO."""
    temp = b.op("Where", [b.col(is_gumbel), b.col("temperature"), b.f32(1.0)], "temp")  # [R, 1]
    x = LOGITS
    if Vp != V:
        pads = b.i64([0, 0, 0, Vp - V])
        x = b.op("Pad", [LOGITS, pads, b.f32(-np.inf)], "padded", mode="constant")  # [R, Vp]
    return b.op("Div", [x, temp], "s")  # [R, Vp]


def _top_k_filter(b: _Builder, s: str, vals: str, K: int) -> tuple[str, tuple[str, str]]:
    """Top-k: keep s >= the k-th largest s (ties kept); off where top_k <= 0.
    Returns the kept tokens ``[R, Vp]`` bool and the k-th value with its on-flag
    (``[R, 1]`` each) for top-p's lower bound and the candidates' threshold."""
    kcol = b.col("top_k")  # [R, 1]
    kidx = b.op("Sub", [b.op("Min", [b.op("Max", [kcol, b.i64(1)]), b.i64(K)]), b.i64(1)], "kidx")  # [R, 1] in 0..K-1
    kth = b.op("GatherElements", [vals, kidx], "kth", axis=1)  # [R, 1]
    k_on = b.op("Greater", [kcol, b.i64(0)], "k_on")  # [R, 1]
    keep = b.op("Or", [b.op("GreaterOrEqual", [s, kth]), b.op("Not", [k_on])], "keep_k")  # [R, Vp]
    return keep, (kth, k_on)


def _top_p_mass(b: _Builder, e: str, keep) -> tuple[str, str]:
    """The top-k- and min-p-filtered masses ``e_k`` ``[R, Vp]`` (e on kept tokens, 0
    elsewhere) and top-p's target ``top_p * Z`` ``[R, 1]``, ``Z = sum(e_k) >= 1``."""
    if keep is not None:
        e = b.op("Mul", [e, b.mask(keep)], "e_k")  # [R, Vp]
    z = b.op("ReduceSum", [e, b.i64([1])], "z", keepdims=1)  # [R, 1], >= 1 (the argmax's e is 1)
    return e, b.op("Mul", [b.col("top_p"), z], "target")  # [R, 1]


def _candidate_draw(b: _Builder, m: str, cands: tuple[str, str], keep, kth_on, mass, C: int, Vp: int) -> tuple[str, str, str]:
    """The nucleus path: the draw over the TopK candidates ``[R]``, whether the row is
    covered ``[R, 1]``, and its threshold ``lo`` ``[R, 1]``.

    Top-p's threshold ``lo_p`` is the candidate value at which the running mass of the
    candidates in descending order (a CumSum of their ``e_k``) first reaches ``top_p * Z``;
    ``lo = max(lo_p, kth)`` over the filters that are on (``-inf`` if none); the row is
    covered when ``lo`` is above the last candidate's value, so that every token with
    ``s >= lo`` is a candidate, ties included. The draw is then the argmax of ``s + g``
    over the kept candidates, ties to the lowest token id: the whole-vocabulary argmax."""
    vals, ids = cands  # [R, C] float32 (descending), [R, C] int64
    lows = []
    if kth_on is not None:
        kth, k_on = kth_on
        lows.append(b.op("Where", [k_on, kth, b.f32(-np.inf)], "lo_k"))  # [R, 1]
    if mass is not None:
        e_k, target = mass
        cum = b.op("CumSum", [b.op("GatherElements", [e_k, ids], "e_c", axis=1), b.i64(1)], "cum")  # [R, C], nondecreasing
        lo_p = m  # [R, 1]: candidate j > 0 is needed while the mass before it, cum[j - 1], is short of the target
        if C > 1:
            short = b.op("Less", [b.op("Slice", [cum, b.i64([0]), b.i64([C - 1]), b.i64([1])], "cum_before"), target], "short")
            after = b.op("Slice", [vals, b.i64([1]), b.i64([C]), b.i64([1])], "vals_after")  # [R, C - 1]
            needed = b.op("Where", [short, after, b.f32(np.inf)], "needed")  # [R, C - 1]
            lo_p = b.op("Min", [m, b.op("ReduceMin", [needed], "lo_short", axes=[1], keepdims=1)], "lo_p")  # [R, 1]
        p_off = b.op("GreaterOrEqual", [b.col("top_p"), b.f32(1.0)], "p_off")  # [R, 1]: top_p >= 1 keeps everything
        lows.append(b.op("Where", [p_off, b.f32(-np.inf), lo_p], "lo_pc"))  # [R, 1]
    lo = lows[0] if len(lows) == 1 else b.op("Max", lows, "lo_c")  # [R, 1]
    last = b.op("Slice", [vals, b.i64([C - 1]), b.i64([C]), b.i64([1])], "last")  # [R, 1]: the C-th largest s
    covered = b.op("Greater", [lo, last], "covered")  # [R, 1]
    kept = b.op("GreaterOrEqual", [vals, lo], "kept_c")  # [R, C]
    if keep is not None:  # top-k (implied by lo) and min-p, read at the candidates
        kept = b.op("And", [kept, b.op("GatherElements", [keep, ids], "keep_c", axis=1)], "kept_c")
    adds, muls, states = _hash_inputs(b, Vp)
    state_a, state_b = (b.op("Gather", [x, ids], f"{x}_c", axis=0) for x in states)  # [R, C] int32: the candidates' states
    h = feistel(b, state_a, state_b, adds, muls)  # [R, C] int32 in [0, 2**23)
    loglog, _ = _loglog(b, h, C)  # [R, C]
    score = b.op("Sub", [vals, loglog], "score_c")  # [R, C]: s + g
    score = b.op("Where", [kept, score, b.f32(-np.inf)], "score_kept_c")  # [R, C]
    best = b.op("ReduceMax", [score], "best", axes=[1], keepdims=1)  # [R, 1]
    tied = b.op("Equal", [score, best], "tied")  # [R, C]
    no_id = b.i64(np.iinfo(np.int64).max)
    token = b.op("ReduceMin", [b.op("Where", [tied, ids, no_id], "tied_ids")], "cand", axes=[1], keepdims=0)  # [R]
    return token, covered, lo


def _top_p_bisect(b: _Builder, s: str, m: str, keep, kth_on, mass) -> tuple[str, str]:
    """Top-p over the whole vocabulary, for rows the candidates do not cover:
    BISECT_STEPS bisection steps for the largest ``lo`` with ``mass(s >= lo) >= top_p * Z``.
    Returns the kept tokens ``[R, Vp]`` and ``lo`` ``[R, 1]``."""
    e, target = mass
    axis1 = b.i64([1])
    floor = b.op("Sub", [m, b.f32(BISECT_SPAN)], "floor")  # [R, 1]
    if kth_on is not None:
        kth, k_on = kth_on
        lo = b.op("Max", [b.op("Where", [k_on, kth, b.f32(-np.inf)]), floor], "lo")  # [R, 1]
    else:
        lo = floor
    hi = m  # [R, 1]
    half = b.f32(0.5)
    for _ in range(BISECT_STEPS):
        mid = b.op("Add", [b.op("Mul", [lo, half]), b.op("Mul", [hi, half])], "mid")  # [R, 1]; lo <= mid <= hi
        above = b.mask(b.op("GreaterOrEqual", [s, mid], "above"))  # [R, Vp]
        mass_above = b.op("ReduceSum", [b.op("Mul", [e, above]), axis1], "mass", keepdims=1)  # [R, 1]
        ok = b.op("GreaterOrEqual", [mass_above, target], "ok")  # [R, 1]
        lo = b.op("Where", [ok, mid, lo], "lo")  # [R, 1]
        hi = b.op("Where", [ok, hi, mid], "hi")  # [R, 1]
    p_off = b.op("GreaterOrEqual", [b.col("top_p"), b.f32(1.0)], "p_off")  # [R, 1]: top_p >= 1 keeps everything
    keep_p = b.op("Or", [b.op("GreaterOrEqual", [s, lo]), p_off], "keep_p")  # [R, Vp]; lo <= m: the argmax stays
    return (keep_p if keep is None else b.op("And", [keep, keep_p], "keep")), lo


def _hash_inputs(b: _Builder, Vp: int) -> tuple[list[str], list[str], tuple[str, str]]:
    """What the hash reads, made once per graph: the row's host-made keys (ROUNDS columns
    ``[R, 1]`` each of ``noise_add`` and ``noise_mul``) and the token states ``(A, B)``,
    int32 ``[Vp]`` initializers."""
    if b.hash_inputs is None:
        ones = b.i64(np.ones(ROUNDS, np.int64))
        adds = b.op("Split", [NOISE_ADD, ones], "noise_add", n_out=ROUNDS, axis=1)  # ROUNDS x [R, 1] in [0, 4096)
        muls = b.op("Split", [NOISE_MUL, ones], "noise_mul", n_out=ROUNDS, axis=1)  # ROUNDS x [R, 1] in [1025, 2047]
        states = tuple(b.init(x, name) for x, name in zip(token_states(Vp), ("token_a", "token_b")))
        b.hash_inputs = (adds, muls, states)
    return b.hash_inputs


def _loglog(b: _Builder, h: str, width: int) -> tuple[str, str]:
    """``(log(-log u), u)``, ``[R, width]`` each (``log(-log u) = -g``, finite), of the hash bits ``h``:
    ``u = (h + 0.5) * 2**-23`` exact in ``[2**-24, 1 - 2**-24]``. The Logs run on rows padded to a multiple of PAD_TO (the
    layout rule of the module docstring), then the padding is cut off."""
    hf = b.op("Cast", [h], "hf", to=TensorProto.FLOAT)  # exact (< 2**24)
    u = b.op("Mul", [b.op("Add", [hf, b.f32(0.5)]), b.f32(2.0**-U_BITS)], "u")
    wide = padded_vocab(width)
    x = u if wide == width else b.op("Pad", [u, b.i64([0, 0, 0, wide - width]), b.f32(0.5)], "u_wide", mode="constant")
    loglog = b.op("Log", [b.op("Neg", [b.op("Log", [x])])], "loglog")
    if wide != width:
        loglog = b.op("Slice", [loglog, b.i64([0]), b.i64([width]), b.i64([1])], "loglog_cut")
    return loglog, u


def _gumbel_argmax(b: _Builder, s: str, keep, Vp: int) -> tuple[str, str]:
    """The Gumbel-max draw ``[R]`` over the whole vocabulary and its ``u`` ``[R, Vp]``: u from the
    hash (the row's host-made keys [R, 1], the token states [Vp], three Feistel rounds on
    [R, Vp] in int32, every value in [0, 2**24)), then ``argmax(s - log(-log u))`` over the
    kept tokens."""
    adds, muls, (state_a, state_b) = _hash_inputs(b, Vp)
    h = feistel(b, state_a, state_b, adds, muls)  # [R, Vp] int32 in [0, 2**23)
    loglog, u = _loglog(b, h, Vp)  # [R, Vp]: log(-log u) = -g, finite
    score = b.op("Sub", [s, loglog], "score")  # [R, Vp]: s + g
    if keep is not None:
        score = b.op("Where", [keep, score, b.f32(-np.inf)], "score_kept")  # [R, Vp]: -inf off the kept tokens
    return b.op("ArgMax", [score], "gumbel", axis=1, keepdims=0, select_last_index=0), u


def _picked_debug(b: _Builder, s: str, m: str, covered: str, lo_c: str, filters, keep_full, lo_full) -> tuple[str, str]:
    """The debug ``keep`` ``[R, Vp]`` and ``lo`` ``[R, 1]`` of the path each row took
    (``filters``: top-k's and min-p's kept tokens, or None)."""
    keep_c = b.op("GreaterOrEqual", [s, lo_c], "kept_lo")  # [R, Vp]
    if filters is not None:
        keep_c = b.op("And", [keep_c, filters], "keep_cand")
    if keep_full is None:
        keep_full = b.op("Equal", [s, s], "all")  # [R, Vp]: True but on NaN
    if lo_full is None:
        lo_full = b.op("Sub", [m, b.f32(np.inf)], "no_lo")  # [R, 1]: -inf
    keep = b.op("Or", [b.op("And", [covered, keep_c]), b.op("And", [b.op("Not", [covered]), keep_full])], "keep_dbg")  # no bool Where on onnxruntime
    return keep, b.op("Where", [covered, lo_c, lo_full], "lo_dbg")


def _debug_outputs(b: _Builder, s: str, m: str, u: str, keep, lo, Vp: int) -> list[onnx.ValueInfoProto]:
    """:data:`DEBUG_OUTPUTS` (u, the candidates, top-p's lo), for tests."""
    if keep is None:
        keep = b.op("Equal", [s, s], "all")  # [R, Vp]: True but on NaN
    if lo is None:
        lo = b.op("Sub", [m, b.f32(np.inf)], "no_lo")  # [R, 1]: -inf
    for name, value in zip(DEBUG_OUTPUTS, (u, keep, lo)):
        b.named("Identity", [value], name)
    return [
        helper.make_tensor_value_info("u", TensorProto.FLOAT, [ROWS, Vp]),
        helper.make_tensor_value_info("keep", TensorProto.BOOL, [ROWS, Vp]),
        helper.make_tensor_value_info("lo", TensorProto.FLOAT, [ROWS, 1]),
    ]

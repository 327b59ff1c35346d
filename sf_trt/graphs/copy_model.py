"""The fake's copy model as an ONNX graph (SPEC behaviour 8).

The row at position ``t`` of a lane favours ``history[j + 1]`` for the latest
``j < t`` with ``history[j] == history[t]``, and a deterministic token when there
is none. With ``copy_miss_every = m > 0``, the row at every position ``t`` with
``(t + 1) % m == 0`` favours another token (a miss). Without ``copy_model`` every
row favours a deterministic function of its token and position.

The favoured token gets logit ``favour_logit`` and every other token 0. The
default, ``ln(vocab - 1) + 0.5``, gives the favoured token most of the probability
(about 62% at temperature 1, 90% at 0.8) but not all, so a sampled decode leaves
it at a visible rate and top-p 0.95 keeps the other tokens in the nucleus.

Inputs: ``history`` int64 ``[max_lanes, max_context]`` (each lane's token state;
positions at or past a row's own are never read, so rolled-back tails are
harmless), ``lanes`` int64 ``[R]``, ``positions`` int64 ``[R]``.
Output: ``logits`` float32 ``[R, vocab]``.
Ops: Gather, GatherElements, Unsqueeze, Equal, Less, Greater, And, Where,
ReduceMax, Mul, Add, Mod (see export/OPS.md).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper

from .builder import GraphBuilder
from .ranges import declare_ranges

__all__ = ["INPUTS", "STATE", "OUTPUT", "build_copy_graph", "default_favour_logit"]

INPUTS = ("history", "lanes", "positions")
STATE = INPUTS[0]
"""The state input: each lane's tokens by position, ``[max_lanes, max_context]``."""
OUTPUT = "logits"


def default_favour_logit(vocab: int) -> float:
    return math.log(vocab - 1) + 0.5


def build_copy_graph(
    vocab: int,
    eos: int,
    max_lanes: int,
    max_context: int,
    copy_miss_every: int = 0,
    copy_model: bool = True,
    favour_logit: float | None = None,
) -> onnx.ModelProto:
    """The copy model (or, with ``copy_model=False``, the fake's plain model)."""
    if vocab < 3 or not 0 <= eos < vocab:
        raise ValueError(f"build_copy_graph: need vocab >= 3 and 0 <= eos < vocab (got vocab={vocab}, eos={eos})")
    if copy_miss_every < 0:
        raise ValueError(f"build_copy_graph: copy_miss_every must be >= 0 (got {copy_miss_every})")
    favour = default_favour_logit(vocab) if favour_logit is None else float(favour_logit)
    g = _CopyGraph(GraphBuilder(), vocab, eos)
    pos_col = g.b.op("Unsqueeze", ["positions", g.b.i64([1])], "pos_col")  # [R, 1]
    rows = g.b.op("Gather", ["history", "lanes"], "rows", axis=0)  # [R, C]
    cur = g.b.op("GatherElements", [rows, pos_col], "cur", axis=1)  # [R, 1]: the row's own token
    favoured = g.copied(rows, cur, pos_col, max_context) if copy_model else g.plain(cur, pos_col)
    if copy_miss_every > 0:
        favoured = g.with_misses(favoured, pos_col, copy_miss_every)
    ids = g.b.i64(np.arange(vocab)[None, :])  # [1, V]
    g.b.named("Where", [g.b.op("Equal", [ids, favoured], "is_favoured"), g.b.f32(favour), g.b.f32(0.0)], OUTPUT)
    model = g.b.model(
        "copy_model",
        [
            helper.make_tensor_value_info("history", TensorProto.INT64, [max_lanes, max_context]),
            helper.make_tensor_value_info("lanes", TensorProto.INT64, ["rows"]),
            helper.make_tensor_value_info("positions", TensorProto.INT64, ["rows"]),
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["rows", vocab])],
        producer="sf_trt.graphs.copy_model",
    )
    # What the fake feeds (tokens, lanes and positions checked at the seam): with these,
    # every integer value here is below 7 * vocab + 3 (export/OPS.md, "Integer arithmetic").
    declare_ranges(model, inputs={"history": (0, vocab - 1), "lanes": (0, max_lanes - 1), "positions": (0, max_context - 1)})
    onnx.checker.check_model(model)
    return model


class _CopyGraph:
    """The pieces of the copy graph; every value is int64 ``[R, 1]`` unless said."""

    def __init__(self, b: GraphBuilder, vocab: int, eos: int) -> None:
        self.b = b
        self.vocab, self.eos, self.one = b.i64(vocab), b.i64(eos), b.i64(1)

    def avoid_eos(self, x: str) -> str:
        """x, moved one past eos where it is eos: misses and fallbacks never end a lane."""
        b = self.b
        bumped = b.op("Mod", [b.op("Add", [x, self.one], "plus1"), self.vocab], "bumped")
        return b.op("Where", [b.op("Equal", [x, self.eos], "is_eos"), bumped, x], "no_eos")

    def copied(self, rows: str, cur: str, pos_col: str, max_context: int) -> str:
        """What followed the latest earlier occurrence of the row's token, else a fallback."""
        b = self.b
        j = b.i64(np.arange(max_context)[None, :])  # [1, C]
        earlier_same = b.op("And", [b.op("Equal", [rows, cur], "same"), b.op("Less", [j, pos_col], "earlier")], "earlier_same")  # [R, C]
        # latest j + 1 among the matches, 0 when there is none
        j1, zero = b.i64(np.arange(1, max_context + 1)[None, :]), b.i64(0)
        latest1 = b.op("ReduceMax", [b.op("Where", [earlier_same, j1, zero], "match_j1")], "latest1", axes=[1], keepdims=1)
        copied = b.op("GatherElements", [rows, latest1], "copied", axis=1)  # history[j + 1]
        cur7p3 = b.op("Add", [b.op("Mul", [cur, b.i64(7)], "cur7"), b.i64(3)], "cur7p3")
        fallback = self.avoid_eos(b.op("Mod", [cur7p3, self.vocab], "fallback_raw"))
        return b.op("Where", [b.op("Greater", [latest1, zero], "has_match"), copied, fallback], "favoured_copy")

    def plain(self, cur: str, pos_col: str) -> str:
        """A deterministic function of the row's token and position (``copy_model=False``)."""
        b = self.b
        mixed = b.op("Add", [b.op("Mul", [cur, b.i64(7)], "cur7"), b.op("Mul", [pos_col, b.i64(13)], "pos13")], "mixed")
        return self.avoid_eos(b.op("Mod", [b.op("Add", [mixed, self.one], "mixed1"), self.vocab], "plain_raw"))

    def with_misses(self, favoured: str, pos_col: str, every: int) -> str:
        """Every ``every``-th position favours the next token instead (a miss)."""
        b = self.b
        pos1 = b.op("Add", [pos_col, self.one], "pos1")
        is_miss = b.op("Equal", [b.op("Mod", [pos1, b.i64(every)], "pos1_mod"), b.i64(0)], "is_miss")
        missed = self.avoid_eos(b.op("Mod", [b.op("Add", [favoured, self.one], "fav1"), self.vocab], "missed_raw"))
        return b.op("Where", [is_miss, missed, favoured], "favoured")

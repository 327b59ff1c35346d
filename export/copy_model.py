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
ReduceMax, Mul, Add, Mod, Cast (see OPS.md).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sf_trt.graph_ranges import declare_ranges

OPSET = 17
INPUTS = ("history", "lanes", "positions")
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
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    i64 = lambda v: np.array(v, np.int64)  # noqa: E731
    c_vocab, c_eos, c_one = const("vocab", i64(vocab)), const("eos", i64(eos)), const("one", i64(1))

    def avoid_eos(x: str, name: str) -> str:
        """x, moved one past eos where it is eos: misses and fallbacks never end a lane."""
        bumped = node("Mod", [node("Add", [x, c_one], f"{name}_plus1"), c_vocab], f"{name}_bumped")
        return node("Where", [node("Equal", [x, c_eos], f"{name}_is_eos"), bumped, x], name)

    pos_col = node("Unsqueeze", ["positions", const("axis1", i64([1]))], "pos_col")  # [R, 1]
    rows = node("Gather", ["history", "lanes"], "rows", axis=0)  # [R, C]
    cur = node("GatherElements", [rows, pos_col], "cur", axis=1)  # [R, 1]: the row's own token
    if copy_model:
        j = const("j", np.arange(max_context, dtype=np.int64)[None, :])  # [1, C]
        earlier_same = node(
            "And", [node("Equal", [rows, cur], "same"), node("Less", [j, pos_col], "earlier")], "earlier_same"
        )  # [R, C]
        # latest j + 1 among the matches, 0 when there is none
        j1 = const("j1", np.arange(1, max_context + 1, dtype=np.int64)[None, :])
        zero = const("zero", i64(0))
        latest1 = node(
            "ReduceMax", [node("Where", [earlier_same, j1, zero], "match_j1")], "latest1", axes=[1], keepdims=1
        )  # [R, 1]
        copied = node("GatherElements", [rows, latest1], "copied", axis=1)  # history[j + 1]
        fallback = avoid_eos(
            node("Mod", [node("Add", [node("Mul", [cur, const("seven", i64(7))], "cur7"), const("three", i64(3))], "cur7p3"), c_vocab], "fallback_raw"),
            "fallback",
        )
        favoured = node("Where", [node("Greater", [latest1, zero], "has_match"), copied, fallback], "favoured_copy")
    else:
        mixed = node(
            "Add",
            [node("Mul", [cur, const("seven", i64(7))], "cur7"), node("Mul", [pos_col, const("thirteen", i64(13))], "pos13")],
            "mixed",
        )
        favoured = avoid_eos(node("Mod", [node("Add", [mixed, c_one], "mixed1"), c_vocab], "plain_raw"), "favoured_copy")
    if copy_miss_every > 0:
        is_miss = node(
            "Equal",
            [node("Mod", [node("Add", [pos_col, c_one], "pos1"), const("miss_every", i64(copy_miss_every))], "pos1_mod"), const("zero_m", i64(0))],
            "is_miss",
        )
        missed = avoid_eos(node("Mod", [node("Add", [favoured, c_one], "fav1"), c_vocab], "missed_raw"), "missed")
        favoured = node("Where", [is_miss, missed, favoured], "favoured")
    ids = const("ids", np.arange(vocab, dtype=np.int64)[None, :])  # [1, V]
    node(
        "Where",
        [node("Equal", [ids, favoured], "is_favoured"), const("favour", np.float32(favour)), const("background", np.float32(0.0))],
        OUTPUT,
    )
    graph = helper.make_graph(
        nodes,
        "copy_model",
        [
            helper.make_tensor_value_info("history", TensorProto.INT64, [max_lanes, max_context]),
            helper.make_tensor_value_info("lanes", TensorProto.INT64, ["rows"]),
            helper.make_tensor_value_info("positions", TensorProto.INT64, ["rows"]),
        ],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["rows", vocab])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sf_trt.export")
    # What the fake feeds (tokens, lanes and positions checked at the seam): with these,
    # every integer value here is below 7 * vocab + 3 (export/OPS.md, "Integer arithmetic").
    declare_ranges(model, inputs={"history": (0, vocab - 1), "lanes": (0, max_lanes - 1), "positions": (0, max_context - 1)})
    onnx.checker.check_model(model)
    return model

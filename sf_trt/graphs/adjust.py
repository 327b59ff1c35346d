"""The logit-adjust graph: penalties, logit bias and ``min_tokens`` on a few entries per row.

``build_adjust_graph(vocab)`` returns the graph that rewrites, in each logits row, the
entries the host lists (vLLM's semantics and order, :class:`sf_trt.abi.SamplingParams`),
before the verify-and-sample graph draws from the row. Only the rows of lanes with an
adjustment go through it, so a batch without one never runs it
(:meth:`sf_trt.primitives.PrimitivesBase.verify_sample`).

Inputs (``rows`` and ``adjust_entries`` are dynamic, the vocabulary ``V`` static):

=====================  =======  ========  ===================================================
name                   dtype    shape     meaning
=====================  =======  ========  ===================================================
``logits``             float32  [R, V]    the rows' logits
``adjust_ids``         int64    [R, E]    the token of each entry, in ``0..V-1``
``adjust_bias``        float32  [R, E]    added first: the logit bias; -inf for a token
                                          ``min_tokens`` holds back
``adjust_scale``       float32  [R, E]    the repetition penalty where the token occurs in
                                          the prompt or the output before the row, else 1
``adjust_frequency``   float32  [R, E]    ``frequency_penalty * count`` (float32 product),
                                          count in the output before the row
``adjust_presence``    float32  [R, E]    ``presence_penalty`` where that count is > 0, else 0
=====================  =======  ========  ===================================================

Output ``adjusted`` float32 ``[R, V]``: the logits, and at each entry's token
``x = logit + bias; x = x > 0 ? x / scale : x * scale; x = x - frequency; x = x - presence``
(vLLM's ``apply_penalties`` after its logit-bias and min-tokens processors, in float32,
op for op). An entry of ``(bias 0, scale 1, frequency 0, presence 0)`` writes its logit
back unchanged (``x + 0``, ``x / 1``, ``x * 1``, ``x - 0`` are exact), so the host pads a
row's entries with copies of its first entry: duplicate indices of ``ScatterElements``
then write the same value, whichever write lands last.

Nothing mixes rows, so an adjusted row is the same in any batch. The integers are the
token ids only, moved by ``GatherElements``/``ScatterElements``, never computed on.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .builder import GraphBuilder

__all__ = ["LOGITS", "IDS", "FLOAT_INPUTS", "INPUTS", "ADJUSTED", "ENTRIES", "build_adjust_graph"]

LOGITS, IDS, ADJUSTED = "logits", "adjust_ids", "adjusted"
FLOAT_INPUTS = ("adjust_bias", "adjust_scale", "adjust_frequency", "adjust_presence")
INPUTS = (LOGITS, IDS) + FLOAT_INPUTS
ENTRIES = "adjust_entries"
"""The entries dim's name (a role in :data:`sf_trt.formats.shapes.DIM_ROLES`)."""


def build_adjust_graph(vocab: int) -> onnx.ModelProto:
    """The logit-adjust graph for a vocabulary of ``vocab`` (module docstring: I/O, semantics)."""
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or vocab < 1:
        raise ValueError(f"build_adjust_graph: vocab must be an int >= 1 (got {vocab!r})")
    g = GraphBuilder()
    bias, scale, frequency, presence = FLOAT_INPUTS
    x = g.op("GatherElements", [LOGITS, IDS], "picked", axis=1)  # [R, E]
    x = g.op("Add", [x, bias], "biased")  # [R, E]
    positive = g.op("Greater", [x, g.f32(0.0)], "positive")  # [R, E]
    x = g.op("Where", [positive, g.op("Div", [x, scale], "shrunk"), g.op("Mul", [x, scale], "grown")], "repeated")  # [R, E]
    x = g.op("Sub", [g.op("Sub", [x, frequency], "after_frequency"), presence], "penalized")  # [R, E]
    g.named("ScatterElements", [LOGITS, IDS, x], ADJUSTED, axis=1)  # [R, V]
    v = int(vocab)
    inputs = [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["rows", v]),
              helper.make_tensor_value_info(IDS, TensorProto.INT64, ["rows", ENTRIES])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["rows", ENTRIES]) for n in FLOAT_INPUTS]
    outputs = [helper.make_tensor_value_info(ADJUSTED, TensorProto.FLOAT, ["rows", v])]
    return g.model("adjust", inputs, outputs, producer="sf_trt.graphs.adjust")

"""The logprobs graph: log-probabilities of drawn tokens, from the rows that drew them.

``build_logprobs_graph(vocab)`` is ``LogSoftmax`` + ``GatherElements`` + ``TopK``;
:class:`sf_trt.backends.ort_logprobs.OrtLogprobs` runs it on onnxruntime. The
executor feeds it the very logit rows the verify-and-sample pass drew the emitted
tokens from; rows are bit-identical however a pass is packed, and this graph
computes each row on its own, so a token's logprob is the same with speculation
on or off, alone or in any batch (``tests/test_logprobs.py`` checks both).

The values are the model's raw distribution: ``log_softmax(logits)`` before
temperature, top-k, top-p or min-p (vLLM's default ``raw_logprobs``), so they do
not depend on how a request samples.

Inputs: ``logits`` float32 ``[R, V]``, ``tokens`` int64 ``[R]`` (``0 <= token < V``).
Outputs: ``token_logprob`` float32 ``[R]``, ``top_ids`` int64 ``[R, N]`` and
``top_logprobs`` float32 ``[R, N]``: the ``N = min(V, TOP_LOGPROBS_MAX)`` most likely
tokens in descending order, the lower id first on ties (ONNX TopK's rule).
The vocabulary is padded with ``-inf`` to a multiple of 16, as the verify graph
does, so every row takes the same vector path in the kernels.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..abi import TOP_LOGPROBS_MAX
from .builder import GraphBuilder
from .verify import PAD_TO, padded_vocab

__all__ = ["TOP_LOGPROBS_MAX", "LOGITS", "TOKENS", "OUTPUTS", "build_logprobs_graph"]

LOGITS, TOKENS = "logits", "tokens"
OUTPUTS = ("token_logprob", "top_ids", "top_logprobs")


def build_logprobs_graph(vocab: int) -> onnx.ModelProto:
    """The logprobs graph for a vocabulary of ``vocab`` (module docstring: I/O)."""
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or vocab < 1:
        raise ValueError(f"build_logprobs_graph: vocab must be an int >= 1 (got {vocab!r})")
    v, vp, n = int(vocab), padded_vocab(int(vocab)), min(TOP_LOGPROBS_MAX, int(vocab))
    g = GraphBuilder()
    x = LOGITS
    if vp != v:
        x = g.op("Pad", [LOGITS, g.i64([0, 0, 0, vp - v]), g.f32(-np.inf)], "padded", mode="constant")  # [R, Vp]
    lsm = g.op("LogSoftmax", [x], "lsm", axis=1)  # [R, Vp]
    axis1 = g.i64([1])
    picked = g.op("GatherElements", [lsm, g.op("Unsqueeze", [TOKENS, axis1], "tok_col")], "picked", axis=1)  # [R, 1]
    g.named("Squeeze", [picked, axis1], OUTPUTS[0])  # [R]
    g.nodes.append(helper.make_node("TopK", [lsm, g.i64([n])], [OUTPUTS[2], OUTPUTS[1]], name="topk", axis=1, largest=1, sorted=1))
    inputs = [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["rows", v]),
              helper.make_tensor_value_info(TOKENS, TensorProto.INT64, ["rows"])]
    outputs = [helper.make_tensor_value_info(OUTPUTS[0], TensorProto.FLOAT, ["rows"]),
               helper.make_tensor_value_info(OUTPUTS[1], TensorProto.INT64, ["rows", n]),
               helper.make_tensor_value_info(OUTPUTS[2], TensorProto.FLOAT, ["rows", n])]
    assert vp % PAD_TO == 0
    return g.model("logprobs", inputs, outputs, producer="sf_trt.graphs.logprobs")

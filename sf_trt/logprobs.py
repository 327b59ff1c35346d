"""Log-probabilities of drawn tokens, from the same logit rows that drew them.

:func:`build_logprobs_graph` is a small ONNX graph (``LogSoftmax`` + ``GatherElements``
+ ``TopK``) that :class:`OrtLogprobs` runs on onnxruntime's CPU provider. The
executor feeds it the very logit rows the verify-and-sample pass drew the emitted
tokens from; rows are bit-identical however a pass is packed, and this graph
computes each row on its own, so a token's logprob is the same with speculation on
or off, alone or in any batch (``tests/test_logprobs.py`` checks both).

The values are the model's raw distribution: ``log_softmax(logits)`` before
temperature, top-k, top-p or min-p (vLLM's default ``raw_logprobs``), so they do
not depend on how a request samples.

Inputs: ``logits`` float32 ``[R, V]``, ``tokens`` int64 ``[R]`` (``0 <= token < V``).
Outputs: ``token_logprob`` float32 ``[R]``, ``top_ids`` int64 ``[R, N]`` and
``top_logprobs`` float32 ``[R, N]``, the ``N = min(V, TOP_LOGPROBS_MAX)`` most likely
tokens in descending order, the lower id first on ties (ONNX TopK's rule).
The vocabulary is padded with ``-inf`` to a multiple of 16 (as the verify graph
does) so every row takes the same vector path in the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

__all__ = ["TOP_LOGPROBS_MAX", "build_logprobs_graph", "OrtLogprobs"]

TOP_LOGPROBS_MAX = 20
"""The most alternatives a token can report (OpenAI's ``top_logprobs`` limit)."""
_PAD_TO = 16
_OPSET = 17


def build_logprobs_graph(vocab: int, top_n: int = TOP_LOGPROBS_MAX) -> "onnx.ModelProto":
    """The logprobs graph for a vocabulary of ``vocab`` (module docstring: I/O)."""
    import onnx
    from onnx import TensorProto, helper

    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1:
        raise ValueError(f"build_logprobs_graph: vocab must be an int >= 1 (got {vocab!r})")
    n = min(int(top_n), vocab)
    vp = -(-vocab // _PAD_TO) * _PAD_TO
    nodes, inits = [], []

    def const(name: str, value) -> str:
        inits.append(onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    x = "logits"
    if vp != vocab:
        nodes.append(helper.make_node(
            "Pad", ["logits", const("pads", np.array([0, 0, 0, vp - vocab], np.int64)), const("neg_inf", np.array(-np.inf, np.float32))],
            ["padded"], mode="constant",
        ))  # [R, Vp]
        x = "padded"
    nodes += [
        helper.make_node("LogSoftmax", [x], ["lsm"], axis=1),  # [R, Vp]
        helper.make_node("Unsqueeze", ["tokens", const("axis1", np.array([1], np.int64))], ["tok_col"]),  # [R, 1]
        helper.make_node("GatherElements", ["lsm", "tok_col"], ["tok_lp"], axis=1),  # [R, 1]
        helper.make_node("Squeeze", ["tok_lp", "axis1"], ["token_logprob"]),  # [R]
        helper.make_node("TopK", ["lsm", const("k", np.array([n], np.int64))], ["top_logprobs", "top_ids"], axis=1, largest=1, sorted=1),
    ]
    graph = helper.make_graph(
        nodes, "logprobs",
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", vocab]),
         helper.make_tensor_value_info("tokens", TensorProto.INT64, ["rows"])],
        [helper.make_tensor_value_info("token_logprob", TensorProto.FLOAT, ["rows"]),
         helper.make_tensor_value_info("top_ids", TensorProto.INT64, ["rows", n]),
         helper.make_tensor_value_info("top_logprobs", TensorProto.FLOAT, ["rows", n])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="sf_trt.logprobs")


class OrtLogprobs:
    """The logprobs graph on onnxruntime's CPU provider (one thread: the rows are few).

    ``run(logits [R, V], tokens [R]) -> (token_logprob [R], top_ids [R, N], top_logprobs [R, N])``.
    """

    def __init__(self, vocab: int) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.vocab = int(vocab)
        self.top_n = min(TOP_LOGPROBS_MAX, self.vocab)
        self._session = ort.InferenceSession(
            build_logprobs_graph(self.vocab).SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )

    def run(self, logits: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        feeds = {"logits": np.ascontiguousarray(logits, np.float32), "tokens": np.ascontiguousarray(tokens, np.int64)}
        lp, ids, top = self._session.run(["token_logprob", "top_ids", "top_logprobs"], feeds)
        return lp, ids.astype(np.int64, copy=False), top

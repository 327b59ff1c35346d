"""The logprobs graph (:mod:`sf_trt.graphs.logprobs`) on onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np

from ..abi import TOP_LOGPROBS_MAX
from .ort_session import open_session

__all__ = ["OrtLogprobs", "HostLogprobs"]


class OrtLogprobs:
    """``run(logits [R, V], tokens [R]) -> (token_logprob [R], top_ids [R, N], top_logprobs [R, N])``
    on one thread (the rows are few: the tokens a pass emitted for lanes that asked)."""

    def __init__(self, vocab: int) -> None:
        from ..graphs import logprobs as graph  # imports onnx: not before a lane asks for logprobs

        self.vocab = int(vocab)
        self.top_n = min(TOP_LOGPROBS_MAX, self.vocab)
        self._names = (graph.LOGITS, graph.TOKENS, list(graph.OUTPUTS))
        self._session = open_session(graph.build_logprobs_graph(self.vocab), threads=1)

    def run(self, logits: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        logits_name, tokens_name, outputs = self._names
        feeds = {logits_name: np.ascontiguousarray(logits, np.float32), tokens_name: np.ascontiguousarray(tokens, np.int64)}
        lp, ids, top = self._session.run(outputs, feeds)
        return lp, ids.astype(np.int64, copy=False), top


class HostLogprobs:
    """A backend's logprobs on the host (mixed into a :class:`~sf_trt.primitives.PrimitivesBase`
    subclass whose capabilities say ``logprobs=True``): the rows' logits read with
    ``logits_host``, then the logprobs graph on onnxruntime's CPU provider, made on first use."""

    _logprobs_runner: "OrtLogprobs | None" = None

    def _logprobs_impl(self, logits, rows: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._logprobs_runner is None:
            self._logprobs_runner = OrtLogprobs(self.capabilities.vocab)
        return self._logprobs_runner.run(self.logits_host(logits)[rows], tokens)

"""The logprobs graph (:mod:`sf_trt.graphs.logprobs`) on onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np

from ..graphs.logprobs import LOGITS, OUTPUTS, TOKENS, TOP_LOGPROBS_MAX, build_logprobs_graph
from .ort_session import open_session

__all__ = ["OrtLogprobs"]


class OrtLogprobs:
    """``run(logits [R, V], tokens [R]) -> (token_logprob [R], top_ids [R, N], top_logprobs [R, N])``
    on one thread (the rows are few: the tokens a pass emitted for lanes that asked)."""

    def __init__(self, vocab: int) -> None:
        self.vocab = int(vocab)
        self.top_n = min(TOP_LOGPROBS_MAX, self.vocab)
        self._session = open_session(build_logprobs_graph(self.vocab), threads=1)

    def run(self, logits: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        feeds = {LOGITS: np.ascontiguousarray(logits, np.float32), TOKENS: np.ascontiguousarray(tokens, np.int64)}
        lp, ids, top = self._session.run(list(OUTPUTS), feeds)
        return lp, ids.astype(np.int64, copy=False), top

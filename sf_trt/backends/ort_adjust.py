"""The logit-adjust graph (:mod:`sf_trt.graphs.adjust`) on onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np

from ..graphs.adjust import ADJUSTED, ALLOWED, FLOAT_INPUTS, IDS, LOGITS, build_adjust_graph
from .ort_session import open_session

__all__ = ["OrtLogitAdjust"]


class OrtLogitAdjust:
    """``run(logits [A, V], adjust) -> adjusted [A, V]`` on one thread, ``adjust`` a
    :class:`sf_trt.primitives.LogitAdjust` whose rows are these ``A`` rows. The session
    is opened on the first run, so a process whose requests adjust nothing never builds it."""

    def __init__(self, vocab: int) -> None:
        self.vocab = int(vocab)
        self._session = None

    def run(self, logits: np.ndarray, adjust) -> np.ndarray:
        if self._session is None:
            self._session = open_session(build_adjust_graph(self.vocab), threads=1)
        feeds = {LOGITS: np.ascontiguousarray(logits, np.float32), IDS: np.ascontiguousarray(adjust.ids, np.int64)}
        for name, value in zip(FLOAT_INPUTS, adjust.values()):
            feeds[name] = np.ascontiguousarray(value, np.float32)
        allowed = adjust.allowed if adjust.allowed is not None else np.ones(logits.shape, bool)
        feeds[ALLOWED] = np.ascontiguousarray(allowed, bool)
        (out,) = self._session.run([ADJUSTED], feeds)
        return out

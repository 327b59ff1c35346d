"""The logit-adjust graph (:mod:`sf_trt.graphs.adjust`) on onnxruntime's CPU provider."""

from __future__ import annotations

import numpy as np

from .ort_session import open_session

__all__ = ["OrtLogitAdjust", "HostLogitAdjust"]


class OrtLogitAdjust:
    """``run(logits [A, V], adjust) -> adjusted [A, V]`` on one thread, ``adjust`` a
    :class:`sf_trt.primitives.LogitAdjust` whose rows are these ``A`` rows. The session
    is opened on the first run, so a process whose requests adjust nothing never builds it."""

    def __init__(self, vocab: int) -> None:
        self.vocab = int(vocab)
        self._session = None

    def run(self, logits: np.ndarray, adjust) -> np.ndarray:
        from ..graphs import adjust as graph  # imports onnx: not before a lane adjusts

        if self._session is None:
            self._session = open_session(graph.build_adjust_graph(self.vocab), threads=1)
        feeds = {graph.LOGITS: np.ascontiguousarray(logits, np.float32), graph.IDS: np.ascontiguousarray(adjust.ids, np.int64)}
        for name, value in zip(graph.FLOAT_INPUTS, adjust.values()):
            feeds[name] = np.ascontiguousarray(value, np.float32)
        (out,) = self._session.run([graph.ADJUSTED], feeds)
        return out


class HostLogitAdjust:
    """A backend's logit adjustments on the host (mixed into a
    :class:`~sf_trt.primitives.PrimitivesBase` subclass): the rows' logits read with
    ``logits_host``, then the adjust graph on onnxruntime's CPU provider, made on first
    use (a process whose requests adjust nothing never builds it). A backend whose
    logits live on a device may run it there instead."""

    _adjuster: "OrtLogitAdjust | None" = None

    def _adjust_impl(self, logits, adjust) -> np.ndarray:
        if self._adjuster is None:
            self._adjuster = OrtLogitAdjust(self.capabilities.vocab)
        host = self.logits_host(logits)
        out = np.array(host, np.float32)  # a plain copy: no pass-form greedy tokens ride along
        out[adjust.rows] = self._adjuster.run(host[adjust.rows], adjust)
        return out

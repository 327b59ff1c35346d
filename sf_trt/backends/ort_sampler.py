"""Verify-and-sample on onnxruntime: the graphs of :mod:`sf_trt.graphs.verify`, run on the CPU.

:class:`OrtVerifySampler` holds sessions for the verify graph and its cheaper
variants and runs, per call, the cheapest one that covers every row:

* no Gumbel row: the greedy graph (``ArgMax`` + ``Equal``);
* no Gumbel row with ``top_k > 0`` / with ``top_p < 1`` / with ``min_p > 0``: the
  variant without the TopK / without the top-p bisection / without the min-p filter;
* otherwise the full graph.

Each variant draws bit-for-bit what the full graph draws on the rows it covers
(``tests/backends/test_ort_sampler.py`` checks it), so which one ran, which depends on the
other rows of the batch, never changes a row's token (SPEC behaviour 3).
Input checks are :class:`~sf_trt.primitives.PrimitivesBase`'s; this only converts
(:func:`sf_trt.graphs.verify.sample_feeds`: the fields, and the row's noise keys from its
``rng_counter_base`` and ``position``).

Every session is opened on its first use, and the graph builders (and onnx) are imported
then: a greedy generate on the decoder's pass form, whose greedy tokens come with the
logits, opens none (peak memory, docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np

from ..abi import Sampling
from ..primitives import SampleRows
from .ort_session import open_session

__all__ = ["OrtVerifySampler"]

_GUMBEL = int(Sampling.GPU_GUMBEL)


class OrtVerifySampler:
    """The verify-and-sample graph on onnxruntime's CPU provider.

    ``run(logits [K, vocab], sample)`` returns ``(tokens [K] int64, match [K] bool)``.
    """

    def __init__(self, vocab: int, top_k_limit: int = 1024, threads: int = 1) -> None:
        self.vocab = int(vocab)
        self.top_k_limit = int(top_k_limit)
        self.threads = int(threads)
        # "greedy", or (top_k used, top_p used, min_p used) -> session; each opened on first use
        self._sessions: dict = {}

    def _session(self, key):
        sess = self._sessions.get(key)
        if sess is None:
            from ..graphs import verify

            if key == "greedy":
                graph = verify.build_greedy_graph(self.vocab)
            else:
                top_k, top_p, min_p = key
                graph = verify.build_verify_graph(self.vocab, self.top_k_limit, top_k=top_k, top_p=top_p, min_p=min_p)
            sess = self._sessions[key] = open_session(graph, threads=self.threads)
        return sess

    def session_for(self, sample: SampleRows) -> str:
        """Which graph :meth:`run` uses for ``sample``: ``"greedy"`` or
        ``"gumbel[+top_k][+top_p][+min_p]"``."""
        gumbel = np.asarray(sample.mode) == _GUMBEL
        if not gumbel.any():
            return "greedy"
        top_k = bool(np.any(np.asarray(sample.top_k)[gumbel] > 0))
        top_p = bool(np.any(np.asarray(sample.top_p, np.float32)[gumbel] < 1.0))
        min_p = bool(np.any(np.asarray(sample.min_p, np.float32)[gumbel] > 0.0))
        return "gumbel" + ("+top_k" if top_k else "") + ("+top_p" if top_p else "") + ("+min_p" if min_p else "")

    def run(self, logits: np.ndarray, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        k = sample.num_rows
        if k == 0:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        from ..graphs import verify

        which = self.session_for(sample)
        # the greedy graph reads no noise: skip hashing the rows' keys for it
        feeds = {verify.LOGITS: np.ascontiguousarray(logits, dtype=np.float32), **verify.sample_feeds(sample, noise=which != "greedy")}
        key = "greedy" if which == "greedy" else ("+top_k" in which, "+top_p" in which, "+min_p" in which)
        tokens, match = self._session(key).run(list(verify.OUTPUTS), feeds)
        return tokens.astype(np.int64, copy=False), match.astype(bool, copy=False)

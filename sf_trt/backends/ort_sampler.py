"""Verify-and-sample on onnxruntime: the graphs of :mod:`sf_trt.graphs.verify`, run on the CPU.

:class:`OrtVerifySampler` holds sessions for the verify graph and its cheaper
variants and runs, per call, the cheapest ones that cover every row:

* no Gumbel row: the greedy graph (``ArgMax`` + ``Equal``);
* no Gumbel row with ``top_k > 0`` / with ``top_p < 1`` / with ``min_p > 0``: the
  variant without the top-k filter / without top-p / without the min-p filter;
* a Gumbel row with ``top_k > 0`` or ``top_p < 1``: first the nucleus path alone
  (:func:`~sf_trt.graphs.verify.build_candidate_graph`, the draw over the row's
  largest ``candidates`` tokens), then, for the rows it does not cover, the verify
  graph on those rows only;
* otherwise the verify graph.

When every Gumbel row's ``top_k`` is at most ``candidates``, the graphs are built with
``top_k_limit = candidates``: one TopK of the candidates' width instead of
``top_k_limit``'s, and the same k-th values (the sorted prefix of a wider TopK).

Each graph draws bit-for-bit what the full verify graph draws on the rows it covers
(``tests/backends/test_ort_sampler.py`` checks it), and no row's draw depends on the
other rows of a run, so which graphs ran, which depends on the other rows of the
batch, never changes a row's token (SPEC behaviour 3).
Input checks are :class:`~sf_trt.primitives.PrimitivesBase`'s; this only converts
(:func:`sf_trt.graphs.verify.sample_feeds`: the fields, and the row's noise keys from its
``rng_counter_base`` and ``position``).

Every session is opened on its first use, and the graph builders (and onnx) are imported
then: a greedy generate on the decoder's pass form, whose greedy tokens come with the
logits, opens none (peak memory, docs/benchmarks.md). A sampled one opens the nucleus
path's session, and the full graph's only when a row is not covered.
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
    ``candidates`` is the nucleus path's width, :data:`sf_trt.graphs.verify.CANDIDATES`
    when None; it is part of the sampler's semantics, as TensorRT's verify engine is built
    with it.
    """

    def __init__(self, vocab: int, top_k_limit: int = 1024, threads: int = 1, candidates: int | None = None) -> None:
        self.vocab = int(vocab)
        self.top_k_limit = int(top_k_limit)
        self.threads = int(threads)
        self._candidates = None if candidates is None else int(candidates)
        # "greedy", or (nucleus path alone, top_k used, top_p used, min_p used, top-k within the
        # candidates) -> session; each opened on first use
        self._sessions: dict = {}

    @property
    def candidates(self) -> int:
        if self._candidates is None:
            from ..graphs.verify import CANDIDATES  # imports onnx: not before a sampled run needs it

            self._candidates = CANDIDATES
        return self._candidates

    def _session(self, key):
        sess = self._sessions.get(key)
        if sess is None:
            from ..graphs import verify

            if key == "greedy":
                graph = verify.build_greedy_graph(self.vocab)
            else:
                nucleus, top_k, top_p, min_p, narrow = key
                build = verify.build_candidate_graph if nucleus else verify.build_verify_graph
                limit = min(self.top_k_limit, self.candidates) if narrow else self.top_k_limit
                graph = build(self.vocab, limit, top_k=top_k, top_p=top_p, min_p=min_p, candidates=self.candidates)
            sess = self._sessions[key] = open_session(graph, threads=self.threads)
        return sess

    def session_for(self, sample: SampleRows) -> str:
        """Which graph :meth:`run` uses for ``sample``: ``"greedy"`` or
        ``"gumbel[+top_k][+top_p][+min_p]"`` (with ``top_k`` or ``top_p``, the nucleus path
        first, then that graph on the rows it does not cover)."""
        gumbel = np.asarray(sample.mode) == _GUMBEL
        if not gumbel.any():
            return "greedy"
        top_k = bool(np.any(np.asarray(sample.top_k)[gumbel] > 0))
        top_p = bool(np.any(np.asarray(sample.top_p, np.float32)[gumbel] < 1.0))
        min_p = bool(np.any(np.asarray(sample.min_p, np.float32)[gumbel] > 0.0))
        return "gumbel" + ("+top_k" if top_k else "") + ("+top_p" if top_p else "") + ("+min_p" if min_p else "")

    def _flags(self, which: str, sample: SampleRows) -> tuple[bool, bool, bool, bool]:
        """(top_k used, top_p used, min_p used, every Gumbel row's top_k within the candidates)."""
        top_k = "+top_k" in which
        gumbel = np.asarray(sample.mode) == _GUMBEL
        narrow = top_k and bool(np.all(np.asarray(sample.top_k)[gumbel] <= self.candidates))
        return top_k, "+top_p" in which, "+min_p" in which, narrow

    def run(self, logits: np.ndarray, sample: SampleRows) -> tuple[np.ndarray, np.ndarray]:
        k = sample.num_rows
        if k == 0:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        from ..graphs import verify

        which = self.session_for(sample)
        # the greedy graph reads no noise: skip hashing the rows' keys for it
        feeds = {verify.LOGITS: np.ascontiguousarray(logits, dtype=np.float32), **verify.sample_feeds(sample, noise=which != "greedy")}
        if which == "greedy":
            return self._draw("greedy", feeds)
        flags = self._flags(which, sample)
        if not (flags[0] or flags[1]):  # no row can be covered by candidates
            return self._draw((False, *flags), feeds)
        tokens, match, covered = self._session((True, *flags)).run([*verify.OUTPUTS, verify.COVERED], feeds)
        tokens, match = tokens.astype(np.int64), match.astype(bool)
        if not covered.all():  # the rows whose kept tokens reach past the candidates: the whole vocabulary
            rest = np.flatnonzero(~covered)
            tokens[rest], match[rest] = self._draw((False, *flags), {name: np.ascontiguousarray(value[rest]) for name, value in feeds.items()})
        return tokens, match

    def _draw(self, key, feeds: dict) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens int64, match bool)`` of session ``key`` on ``feeds``."""
        from ..graphs.verify import OUTPUTS

        tokens, match = self._session(key).run(list(OUTPUTS), feeds)
        return tokens.astype(np.int64, copy=False), match.astype(bool, copy=False)

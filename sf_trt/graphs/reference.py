"""The sampler in numpy, for tests: :func:`reference_verify_sample` models what the
verify graph (:mod:`sf_trt.graphs.verify`) draws, and how close each row is to a
decision that float32 rounding could flip."""

from __future__ import annotations

import numpy as np

from .noise import hash_u
from .verify import BISECT_SPAN, BISECT_STEPS, CANDIDATES, GUMBEL, topk_k

__all__ = ["reference_verify_sample"]


def reference_verify_sample(
    logits: np.ndarray,
    mode: np.ndarray,
    temperature: np.ndarray,
    top_p: np.ndarray,
    top_k: np.ndarray,
    rng_counter_base: np.ndarray,
    position: np.ndarray,
    draft: np.ndarray,
    min_p: np.ndarray | None = None,
    *,
    top_k_limit: int = 1024,
    candidates: int = CANDIDATES,
    details: bool = False,
):
    """The sampler in numpy: ``(tokens [R] int64, match [R] bool)``.

    ``s`` is computed in float32 (bit-identical to the graph's ``Div``), ``u`` exactly as
    the graph's; the softmax, the candidates' running mass, the bisection and ``g`` run in
    float64, so a row whose decision is within float32 rounding of a tie or of the top-p
    threshold may differ from the graph. ``top_k_limit`` and ``candidates`` are the
    graph's. ``details=True`` adds a dict: ``keep`` [R, V], ``lo`` [R], ``s`` [R, V],
    ``covered`` [R] (the Gumbel rows the nucleus path draws),
    and how close each row is to such a flip: ``score_gap`` [R] (best minus second-best
    kept score), ``lo_gap`` [R] (the lowest ``s`` top-p keeps minus the highest it drops) and
    ``mass_gap`` [R] (distance from ``top_p`` to the nearest cumulative probability of the
    tokens in descending order); the last two are +inf where top-p is off; ``min_p_gap``
    [R] (distance from ``min_p`` to the nearest ``exp(s - m)``; +inf where min-p is off).
    ``min_p`` None means 0 on every row.
    """
    logits = np.asarray(logits, np.float32)
    R, V = logits.shape
    mode = np.asarray(mode, np.int64)
    gum = mode == GUMBEL
    temp = np.where(gum, np.asarray(temperature, np.float32), np.float32(1.0)).astype(np.float32)
    s = (logits / temp[:, None]).astype(np.float64)  # float32 division, then widened
    K = topk_k(V, top_k_limit)
    top_k = np.asarray(top_k, np.int64)
    vals = -np.sort(-s, axis=1)[:, :K]
    kidx = np.clip(top_k - 1, 0, K - 1)
    kth = vals[np.arange(R), kidx]
    k_on = top_k > 0
    m = vals[:, 0]
    mp = np.zeros(R, np.float64) if min_p is None else np.asarray(min_p, np.float32).astype(np.float64)
    with np.errstate(under="ignore", invalid="ignore"):
        ratio = np.exp(s - m[:, None])  # p / p_max
    keep_k = ((s >= kth[:, None]) | ~k_on[:, None]) & (ratio >= mp[:, None])  # top-k and min-p
    e = np.where(keep_k, ratio, 0.0)
    z = e.sum(axis=1)
    tp = np.asarray(top_p, np.float32).astype(np.float64)
    target = tp * z
    lo = np.maximum(np.where(k_on, kth, -np.inf), m - BISECT_SPAN)
    hi = m.copy()
    for _ in range(BISECT_STEPS):
        mid = 0.5 * lo + 0.5 * hi
        mass = np.where(keep_k & (s >= mid[:, None]), e, 0.0).sum(axis=1)
        ok = mass >= target
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    p_off = tp >= 1.0
    keep = keep_k & ((s >= lo[:, None]) | p_off[:, None])
    # the nucleus path: the running mass of the C candidates in descending order
    C = topk_k(V, candidates)
    cand = -np.sort(-s, axis=1)[:, :C]
    cum = np.cumsum(np.take_along_axis(e, np.argsort(-s, axis=1, kind="stable")[:, :C], axis=1), axis=1)
    lo_p = cand[np.arange(R), np.minimum((cum < target[:, None]).sum(axis=1), C - 1)]
    lo_c = np.maximum(np.where(k_on, kth, -np.inf), np.where(p_off, -np.inf, lo_p))
    covered = gum & (lo_c > cand[:, C - 1])
    keep = np.where(covered[:, None], keep_k & (s >= lo_c[:, None]), keep)
    lo = np.where(covered, lo_c, lo)
    u = hash_u(rng_counter_base, position, V)
    g = -np.log(-np.log(u))
    score = np.where(keep, s + g, -np.inf)
    tokens = np.where(gum, score.argmax(axis=1), logits.argmax(axis=1)).astype(np.int64)
    match = tokens == np.asarray(draft, np.int64)
    if not details:
        return tokens, match
    top2 = -np.sort(-score, axis=1)[:, :2] if V > 1 else np.concatenate([score, np.full((R, 1), -np.inf)], axis=1)
    with np.errstate(invalid="ignore"):
        score_gap = np.where(np.isfinite(top2[:, 1]), top2[:, 0] - top2[:, 1], np.inf)
        kept_p = keep_k & (s >= lo[:, None])
        dropped_p = keep_k & ~kept_p
        lowest_kept = np.min(np.where(kept_p, s, np.inf), axis=1)
        highest_dropped = np.max(np.where(dropped_p, s, -np.inf), axis=1)
        lo_gap = np.where(p_off, np.inf, lowest_kept - highest_dropped)
        order = np.argsort(-np.where(keep_k, s, -np.inf), axis=1, kind="stable")
        cum = np.cumsum(np.take_along_axis(e, order, axis=1), axis=1) / z[:, None]
        mass_gap = np.where(p_off, np.inf, np.min(np.abs(cum - tp[:, None]), axis=1))
        min_p_gap = np.where(mp > 0, np.min(np.abs(ratio - mp[:, None]), axis=1), np.inf)
    return tokens, match, {
        "keep": keep, "lo": lo, "covered": covered, "score_gap": score_gap, "lo_gap": lo_gap, "mass_gap": mass_gap, "min_p_gap": min_p_gap, "s": s,
    }

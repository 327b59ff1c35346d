"""Helpers for tests that feed rows to a decoder backend: packing rows, comparing bits."""

from __future__ import annotations

import numpy as np

from sf_trt.primitives import Rows

SEQ = np.random.default_rng(7).integers(0, 256, 48)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def rows(lane: int, start: int, tokens, logits="all") -> Rows:
    n = len(tokens)
    wanted = np.arange(n) if isinstance(logits, str) else np.asarray(logits)
    return Rows(np.full(n, lane, np.int64), np.arange(start, start + n, dtype=np.int64), np.asarray(tokens, np.int64), wanted.astype(np.int64))


def concat(*parts: Rows) -> Rows:
    """One pass made of several lanes' rows; logit rows re-indexed into the whole."""
    offsets = np.cumsum([0] + [p.num_rows for p in parts[:-1]])
    return Rows(
        np.concatenate([p.lanes for p in parts]), np.concatenate([p.positions for p in parts]),
        np.concatenate([p.tokens for p in parts]), np.concatenate([p.logit_rows + o for p, o in zip(parts, offsets)]),
    )


def close_to_reference(got: np.ndarray, ref: np.ndarray) -> None:
    # fp32 graph vs float64 numpy: a few ulps of the largest logit
    np.testing.assert_allclose(got, ref, rtol=0, atol=3e-6 * float(np.abs(ref).max()))

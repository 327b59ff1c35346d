"""Helpers for tests that feed rows to a backend or the verify graph: packing rows, comparing bits, random sample rows."""

from __future__ import annotations

import functools

import numpy as np
import onnxruntime as ort

from sf_trt.graphs import verify
from sf_trt.primitives import Rows

SEQ = np.random.default_rng(7).integers(0, 256, 48)


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def schedules_for(s) -> dict:
    """Packings of a :class:`conftest.Schedules`' lanes: chunks of each lane alone, lanes mixed in passes."""
    return {
        "chunks of 2": s.chunked(2),
        "chunks of 3": s.chunked(3),
        "chunks of 4": s.chunked(4),
        "chunks of 9": s.chunked(9),
        "all at once": s.chunked(10**6),
        "lanes mixed 1/4/9": s.mixed([1, 4, 9], lambda k: [0, 1, 2] if k % 2 else [2, 0, 1]),
        "lanes mixed 3/1/7/2": s.mixed([3, 1, 7, 2], lambda k: [1, 2, 0]),
        "one long, two decoding": s.mixed([16, 1, 1], lambda k: [0, 1, 2]),
        "two lanes, slots 0 and 2": s.mixed([2, 5], lambda k: [2, 0] if k % 2 else [0, 2]),
    }


def assert_rows_exact(prims, sched) -> None:
    """Every schedule of :func:`schedules_for` gives each lane's rows the bits of plain decoding (one row a pass)."""
    assert_schedules_exact(prims, sched, schedules_for(sched))


def assert_schedules_exact(prims, sched, schedules: dict, label: str = "") -> dict:
    """Each of ``schedules`` (name -> schedule) gives each lane's rows the bits of plain decoding
    (one row a pass); returns the plain rows. Every failure is listed, ``label`` before each."""
    plain = sched.run(prims, sched.plain())
    failures = []
    for name, schedule in schedules.items():
        got = sched.run(prims, schedule)
        for lane in sched.seqs:
            n = len(got[lane])
            bad = np.any(bits(got[lane]) != bits(plain[lane][:n]), axis=1)
            if bad.any():
                failures.append(f"{label}{name}: lane {lane}, {int(bad.sum())} of {n} rows differ (max {np.abs(got[lane] - plain[lane][:n]).max():.3g})")
    assert not failures, "\n".join(failures)
    return plain


def rows(lane: int, start: int, tokens, logits="all") -> Rows:
    n = len(tokens)
    wanted = np.arange(n) if isinstance(logits, str) else np.asarray(logits)
    return Rows(np.full(n, lane, np.int64), np.arange(start, start + n, dtype=np.int64), np.asarray(tokens, np.int64), wanted.astype(np.int64))


def concat(*parts: Rows) -> Rows:
    """One pass made of several lanes' rows; logit rows re-indexed into the whole."""
    offsets = np.cumsum([0] + [p.num_rows for p in parts[:-1]])
    return Rows(
        np.concatenate([p.slots for p in parts]), np.concatenate([p.positions for p in parts]),
        np.concatenate([p.tokens for p in parts]), np.concatenate([p.logit_rows + o for p, o in zip(parts, offsets)]),
    )


def close_to_reference(got: np.ndarray, ref: np.ndarray) -> None:
    # fp32 graph vs float64 numpy: a few ulps of the largest logit
    np.testing.assert_allclose(got, ref, rtol=0, atol=3e-6 * float(np.abs(ref).max()))


def random_sample_feeds(rng: np.random.Generator, top_k_limit: int, rows: int, vocab: int, *, ties: bool = False, gumbel_share: float = 0.7):
    """Logits and every SampleRows field for ``rows`` random rows (many modes, filters,
    keys and drafts at once); ``ties``: small integer logits, exact ties everywhere."""
    if ties:  # small integers: exact ties everywhere
        logits = rng.integers(-3, 3, (rows, vocab)).astype(np.float32)
    else:
        logits = (rng.normal(0, rng.uniform(0.5, 4), (rows, vocab))).astype(np.float32)
    return {
        "logits": logits,
        "mode": (rng.random(rows) < gumbel_share).astype(np.int64),
        "temperature": rng.choice([0.25, 0.5, 0.8, 1.0, 1.7], rows).astype(np.float32),
        "top_p": rng.choice([1.0, 1.0, 0.95, 0.9, 0.5, 0.2, float(rng.uniform(0.05, 1))], rows).astype(np.float32),
        "top_k": rng.choice([0, 0, 1, 2, 3, 7, top_k_limit, 1000], rows).astype(np.int64),
        "rng_counter_base": rng.integers(0, 2**63 - 1, rows, dtype=np.int64, endpoint=True),
        "position": rng.integers(0, 2**31, rows, dtype=np.int64),
        "draft": rng.integers(-1, vocab, rows, dtype=np.int64),
        "min_p": rng.choice([0.0, 0.0, 0.0, 0.05, 0.2, 0.5, 1.0, float(rng.uniform(0, 1))], rows).astype(np.float32),
    }


@functools.lru_cache(maxsize=None)
def verify_session(
    vocab: int, top_k_limit: int = 16, top_k: bool = True, top_p: bool = True, debug: bool = True, greedy: bool = False, min_p: bool = True,
    candidates: int = verify.CANDIDATES, nucleus: bool = False,
):
    """A one-thread onnxruntime session of the verify graph (or its greedy twin, or with
    ``nucleus`` its nucleus path alone, which has no debug outputs), built once per arguments."""
    if greedy:
        model = verify.build_greedy_graph(vocab)
    elif nucleus:
        model = verify.build_candidate_graph(vocab, top_k_limit, top_k=top_k, top_p=top_p, min_p=min_p, candidates=candidates)
    else:
        model = verify.build_verify_graph(vocab, top_k_limit, top_k=top_k, top_p=top_p, min_p=min_p, debug=debug, candidates=candidates)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def direct_logprobs(prims, tokens) -> np.ndarray:
    """Each of ``tokens[1:]``'s logprob after the tokens before it, computed directly: one
    pass over the whole sequence in slot 0 (released after), log-softmax in float64."""
    seq = np.asarray(tokens, np.int64)
    n = len(seq) - 1
    logits = prims.logits_host(prims.forward(Rows(np.zeros(n, np.int64), np.arange(n), seq[:n], np.arange(n)))).astype(np.float64)
    prims.release(0)
    lsm = logits - logits.max(axis=1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(axis=1, keepdims=True))
    return lsm[np.arange(n), seq[1:]]

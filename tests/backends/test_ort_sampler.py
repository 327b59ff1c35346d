"""Verify-and-sample on onnxruntime (sf_trt.backends.ort_sampler): the cheapest graph that covers a batch, the same draws."""

from __future__ import annotations


import numpy as np
import pytest

from sf_trt.graphs import verify as V
from sf_trt.primitives import SAMPLE_ROW_FIELDS, SampleRows
from sf_trt.backends.ort_sampler import OrtVerifySampler

from rows import random_sample_feeds as random_feeds
from rows import verify_session as session

VOCABS = (5, 37, 64, 300)  # 64: no padding; the others padded to a multiple of 16


TOPK_LIMIT = 16


def run(feeds, vocab, **kw):
    """(tokens, match[, u, keep, lo]) of the graph on the row dict ``feeds`` (logits and SampleRows fields)."""
    return session(vocab, **kw).run(None, {"logits": feeds["logits"], **V.sample_feeds(sample_rows(feeds))})


def sample_rows(feeds) -> SampleRows:
    return SampleRows(**{name: feeds[name] for name in SAMPLE_ROW_FIELDS})


def test_sampler_picks_the_cheapest_graph_and_draws_what_the_full_graph_draws():
    vocab = 37
    sampler = OrtVerifySampler(vocab, top_k_limit=TOPK_LIMIT)
    rng = np.random.default_rng(7)
    feeds = random_feeds(rng, TOPK_LIMIT, 24, vocab)
    cases = {
        "greedy": dict(mode=0),
        "gumbel": dict(top_k=0, top_p=1.0, min_p=0.0),
        "gumbel+top_k": dict(top_p=1.0, min_p=0.0),
        "gumbel+top_p": dict(top_k=0, min_p=0.0),
        "gumbel+min_p": dict(top_k=0, top_p=1.0, min_p=0.1),
        "gumbel+top_k+top_p": dict(min_p=0.0),
        "gumbel+top_k+top_p+min_p": dict(min_p=0.1),
    }
    for which, override in cases.items():
        f = dict(feeds)
        for name, value in override.items():
            f[name] = np.full(24, value, f[name].dtype)
        if which != "greedy":
            f["top_k"] = np.where(f["mode"] == 1, f["top_k"], 5)  # greedy rows' params never matter
            f["top_p"] = np.where(f["mode"] == 1, f["top_p"], np.float32(0.3))
            f["min_p"] = np.where(f["mode"] == 1, f["min_p"], np.float32(0.5))
        sample = sample_rows(f)
        assert sampler.session_for(sample) == which
        tokens, match = sampler.run(f["logits"], sample)
        assert tokens.dtype == np.int64 and match.dtype == np.bool_ and tokens.shape == (24,)
        np.testing.assert_array_equal(tokens, run(f, vocab)[0])
        np.testing.assert_array_equal(match, tokens == f["draft"])


def test_sampler_converts_dtypes_and_layouts_and_handles_no_rows():
    vocab = 37
    sampler = OrtVerifySampler(vocab, top_k_limit=TOPK_LIMIT)
    tokens, match = sampler.run(np.zeros((0, vocab), np.float32), SampleRows.empty())
    assert tokens.shape == (0,) and tokens.dtype == np.int64 and match.shape == (0,) and match.dtype == np.bool_
    rng = np.random.default_rng(3)
    feeds = random_feeds(rng, TOPK_LIMIT, 10, vocab)
    want = sampler.run(feeds["logits"], sample_rows(feeds))
    wide = np.asfortranarray(np.concatenate([feeds["logits"], feeds["logits"]], axis=1).astype(np.float64))[:, :vocab]
    odd = {k: (v.astype(np.int32) if v.dtype == np.int64 and k != "rng_counter_base" else v.astype(np.float64) if v.dtype == np.float32 else v)[::-1][::-1] for k, v in feeds.items()}
    got = sampler.run(wide, sample_rows(odd))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


class _Counted:
    """A session whose runs are counted, with the rows each run got."""

    def __init__(self, sess) -> None:
        self.sess, self.rows = sess, []

    def run(self, names, feeds):
        self.rows.append(len(feeds["mode"]))
        return self.sess.run(names, feeds)


def test_sampler_runs_the_nucleus_path_then_the_full_graph_on_the_rows_it_does_not_cover_only():
    vocab, candidates = 37, 4
    sampler = OrtVerifySampler(vocab, top_k_limit=TOPK_LIMIT, candidates=candidates)
    feeds = random_feeds(np.random.default_rng(5), TOPK_LIMIT, 40, vocab, gumbel_share=0.9)
    feeds["top_p"][:10] = np.float32(0.99)  # wide nuclei: past 4 candidates
    feeds["top_p"][10:20] = np.float32(0.2)  # narrow ones
    sample = sample_rows(feeds)
    flags = sampler._flags(sampler.session_for(sample), sample)
    nucleus_sess, full_sess = _Counted(sampler._session((True, *flags))), _Counted(sampler._session((False, *flags)))
    sampler._sessions[(True, *flags)], sampler._sessions[(False, *flags)] = nucleus_sess, full_sess
    tokens, match = sampler.run(feeds["logits"], sample)
    full = session(vocab, candidates=candidates).run(None, {"logits": feeds["logits"], **V.sample_feeds(sample)})
    np.testing.assert_array_equal(tokens, full[0])
    np.testing.assert_array_equal(match, full[1])
    covered = session(vocab, candidates=candidates, nucleus=True).run(None, {"logits": feeds["logits"], **V.sample_feeds(sample)})[2]
    assert nucleus_sess.rows == [40] and full_sess.rows == [int((~covered).sum())] and 0 < full_sess.rows[0] < 40
    # a batch the candidates cover takes one run
    f = {k: v[covered] for k, v in feeds.items()}
    sampler.run(f["logits"], sample_rows(f))
    assert nucleus_sess.rows == [40, int(covered.sum())] and len(full_sess.rows) == 1


@pytest.mark.parametrize("candidates", [4, 16, V.CANDIDATES])
def test_a_rows_token_is_the_same_in_every_batch_the_sampler_runs(candidates):
    """Greedy, unfiltered, top-k, top-p and min-p rows, covered and not, alone and in batches of
    every size: the sessions run depend on the batch, the tokens do not."""
    vocab = 300
    sampler = OrtVerifySampler(vocab, top_k_limit=TOPK_LIMIT, candidates=candidates)
    rng = np.random.default_rng(candidates)
    feeds = random_feeds(rng, TOPK_LIMIT, 24, vocab)
    feeds["top_p"][:6] = np.float32(0.99)
    tokens, match = sampler.run(feeds["logits"], sample_rows(feeds))
    for r in range(24):
        alone = sampler.run(feeds["logits"][r : r + 1], sample_rows({k: v[r : r + 1] for k, v in feeds.items()}))
        assert (alone[0][0], alone[1][0]) == (tokens[r], match[r])
    for size in (2, 3, 5, 9, 16):
        idx = rng.choice(24, size, replace=False)
        got = sampler.run(feeds["logits"][idx], sample_rows({k: v[idx] for k, v in feeds.items()}))
        np.testing.assert_array_equal(got[0], tokens[idx])
        np.testing.assert_array_equal(got[1], match[idx])


def test_gemmas_262k_vocabulary_keeps_greedy_top_k_and_top_p_right():
    """At Gemma 3's vocabulary (262144): greedy and top-k 1 and a top-p that keeps one token draw
    the argmax; top-k 5 draws one of the five largest; a narrow nucleus stays inside it."""
    vocab, rows = 262144, 6
    rng = np.random.default_rng(21)
    logits = rng.normal(0, 3, (rows, vocab)).astype(np.float32)
    logits[np.arange(rows), rng.integers(0, vocab, rows)] += 30  # one clear winner per row, anywhere in the vocabulary

    def draw(**kw) -> np.ndarray:
        full = dict(mode=1, temperature=1.0, top_p=1.0, top_k=0)
        full.update(kw)
        sample = SampleRows(
            mode=np.full(rows, full["mode"], np.int64), temperature=np.full(rows, full["temperature"], np.float32),
            top_p=np.full(rows, full["top_p"], np.float32), top_k=np.full(rows, full["top_k"], np.int64),
            rng_counter_base=np.arange(rows, dtype=np.int64) + 3, position=np.arange(rows, dtype=np.int64) + 40,
            draft=np.full(rows, -1, np.int64), min_p=np.zeros(rows, np.float32),
        )
        return OrtVerifySampler(vocab, top_k_limit=64).run(logits, sample)[0]

    argmax = logits.argmax(axis=1)
    assert np.array_equal(draw(mode=0), argmax)
    assert np.array_equal(draw(top_k=1), argmax)
    assert np.array_equal(draw(top_p=1e-6), argmax)
    flat = logits.copy()
    flat[np.arange(rows), argmax] -= 30  # no winner: top-k 5 must still stay in the five largest
    logits = flat
    top5 = np.argsort(-logits, axis=1)[:, :5]
    for t in (0.5, 1.0, 2.0):
        got = draw(top_k=5, temperature=t)
        assert all(g in row for g, row in zip(got, top5))

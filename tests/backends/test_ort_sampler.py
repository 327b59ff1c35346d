"""Verify-and-sample on onnxruntime (sf_trt.backends.ort_sampler): the cheapest graph that covers a batch, the same draws."""

from __future__ import annotations

import dataclasses

import numpy as np

from sf_trt.graphs import verify as V
from sf_trt.primitives import SampleRows
from sf_trt.backends.ort_sampler import OrtVerifySampler

from rows import random_sample_feeds as random_feeds
from rows import verify_session as session

VOCABS = (5, 37, 64, 300)  # 64: no padding; the others padded to a multiple of 16


TOPK_LIMIT = 16


def run(feeds, vocab, **kw):
    """(tokens, match[, u, keep, lo]) of the graph on the row dict ``feeds`` (logits and SampleRows fields)."""
    return session(vocab, **kw).run(None, {"logits": feeds["logits"], **V.sample_feeds(sample_rows(feeds))})


def sample_rows(feeds) -> SampleRows:
    return SampleRows(**{f.name: feeds[f.name] for f in dataclasses.fields(SampleRows)})


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

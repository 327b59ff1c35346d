"""The verify-and-sample graph (sf_trt.graphs.verify): semantics, variants, the hash, against the numpy reference."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sf_trt.export.trt_support import check_graph, errors_in

from sf_trt.graphs import noise as N
from sf_trt.graphs import verify as V
from sf_trt.graphs.reference import reference_verify_sample
from sf_trt.primitives import SAMPLE_ROW_FIELDS, SampleRows

from rows import random_sample_feeds as random_feeds
from rows import verify_session as session

SAMPLE_FIELDS = list(SAMPLE_ROW_FIELDS)
ROOT = Path(__file__).resolve().parents[2]


BITWISE = {"BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"}


VOCABS = (5, 37, 64, 300)  # 64: no padding; the others padded to a multiple of 16


TOPK_LIMIT = 16


VARIANTS = tuple((k, p, m) for k in (True, False) for p in (True, False) for m in (True, False))  # (top_k, top_p, min_p), full first


fast = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def graph_feeds(feeds):
    """A row dict (logits and the SampleRows fields) as the graph's inputs."""
    return {"logits": feeds["logits"], **V.sample_feeds(sample_rows(feeds))}


def run(feeds, vocab, **kw):
    """(tokens, match[, u, keep, lo]) of the graph on the row dict ``feeds``."""
    return session(vocab, **kw).run(None, graph_feeds(feeds))


def take(feeds, idx):
    return {k: np.ascontiguousarray(v[idx]) for k, v in feeds.items()}


def gumbel_rows(rows: int, vocab: int, logits, *, temperature=1.0, top_p=1.0, top_k=0, key0=0, min_p=0.0):
    """Rows that all draw from the same logits under different (key, position) pairs."""
    i = np.arange(rows, dtype=np.int64)
    return {
        "logits": np.broadcast_to(np.asarray(logits, np.float32), (rows, vocab)).copy(),
        "mode": np.ones(rows, np.int64),
        "temperature": np.full(rows, temperature, np.float32),
        "top_p": np.full(rows, top_p, np.float32),
        "top_k": np.full(rows, top_k, np.int64),
        "rng_counter_base": key0 + i // 64,
        "position": (i % 64) * 3 + 1,
        "draft": np.full(rows, -1, np.int64),
        "min_p": np.full(rows, min_p, np.float32),
    }


seeds = st.integers(0, 2**32 - 1)


def ops_md_verify_ops() -> set[str]:
    text = (ROOT / "export" / "OPS.md").read_text()
    section = text.split("\n## verify", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([A-Za-z]+)` \|", section, flags=re.M))


def all_graphs():
    for vocab in (37, 64):
        yield f"greedy V={vocab}", V.build_greedy_graph(vocab)
        for top_k, top_p, min_p in VARIANTS:
            for debug in (False, True):
                yield f"V={vocab} top_k={top_k} top_p={top_p} min_p={min_p} debug={debug}", V.build_verify_graph(
                    vocab, TOPK_LIMIT, top_k=top_k, top_p=top_p, min_p=min_p, debug=debug
                )


def test_every_graph_checks_and_uses_only_the_ops_in_ops_md():
    listed = ops_md_verify_ops()
    assert {"ArgMax", "TopK", "Split", "Log"} <= listed and not listed & (BITWISE | {"Mod"})
    for name, model in all_graphs():
        onnx.checker.check_model(model, full_check=True)
        used = {n.op_type for n in model.graph.node}
        assert used <= listed, f"{name}: ops not in OPS.md: {sorted(used - listed)}"
        assert not used & BITWISE, name
        assert all(n.domain in ("", "ai.onnx") for n in model.graph.node), name
        assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)], name
        # TensorRT would refuse only the inputs a variant does not read (it drops them): the
        # cheaper variants are onnxruntime's; TensorRT runs the full graph
        errors = errors_in(check_graph(model))
        assert all("read by no node" in f.problem for f in errors), (name, [str(f) for f in errors])
        assert {f.node for f in errors} == unread_inputs(name), name


def unread_inputs(name: str) -> set[str]:
    """The inputs a graph of :func:`all_graphs` does not read."""
    if name.startswith("greedy"):
        return {"mode", "temperature", "top_p", "top_k", "noise_add", "noise_mul", "min_p"}
    return {field for field in ("top_k", "top_p", "min_p") if f"{field}=False" in name}


def test_io_names_dims_and_dtypes():
    model = V.build_verify_graph(37, TOPK_LIMIT)
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert list(dims) == list(V.INPUTS) and [o.name for o in model.graph.output] == list(V.OUTPUTS)
    assert dims["logits"] == [V.ROWS, 37] and all(dims[n] == [V.ROWS] for n in V.SAMPLE_FIELDS)
    assert dims[V.NOISE_ADD] == dims[V.NOISE_MUL] == [V.ROWS, N.ROUNDS]
    types = {i.name: i.type.tensor_type.elem_type for i in list(model.graph.input) + list(model.graph.output)}
    T = onnx.TensorProto
    assert types == {
        "logits": T.FLOAT, "mode": T.INT64, "temperature": T.FLOAT, "top_p": T.FLOAT, "top_k": T.INT64,
        "noise_add": T.INT32, "noise_mul": T.INT32, "draft": T.INT64, "min_p": T.FLOAT, "tokens": T.INT64, "match": T.BOOL,
    }
    greedy = V.build_greedy_graph(37)
    assert [i.name for i in greedy.graph.input] == list(V.INPUTS) and [o.name for o in greedy.graph.output] == list(V.OUTPUTS)


def test_topk_is_static_sorted_largest_and_below_3840():
    # K = max(min(vocab, top_k_limit), min(vocab, candidates)): the k-th value and the candidates from one TopK
    for vocab, limit, candidates, k in ((37, 16, 8, 16), (37, 16, 256, 37), (37, 1024, 256, 37), (5000, 3839, 256, 3839), (5000, 16, 256, 256)):
        model = V.build_verify_graph(vocab, limit, candidates=candidates)
        inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
        (topk,) = [n for n in model.graph.node if n.op_type == "TopK"]
        attrs = {a.name: a.i for a in topk.attribute}
        assert attrs == {"axis": 1, "largest": 1, "sorted": 1}
        assert inits[topk.input[1]].tolist() == [k] and k < 3840
    for bad in (3840, 5000):
        with pytest.raises(ValueError, match="3840"):
            V.build_verify_graph(5000, bad)
        with pytest.raises(ValueError, match="candidates .*3840"):
            V.build_verify_graph(5000, 16, candidates=bad)
    with pytest.raises(ValueError):
        V.build_verify_graph(37, 0)


@fast
@given(seeds, st.sampled_from(VOCABS))
def test_greedy_is_argmax_lowest_id_on_ties_and_both_graphs_agree_bit_for_bit(seed, vocab):
    rng = np.random.default_rng(seed)
    feeds = random_feeds(rng, TOPK_LIMIT, 12, vocab, ties=True, gumbel_share=0.5)
    tokens = run(feeds, vocab)[0]
    want = np.argmax(feeds["logits"], axis=1)  # numpy: the first (lowest) index of the max
    first_max = np.array([np.flatnonzero(r == r.max())[0] for r in feeds["logits"]])
    np.testing.assert_array_equal(want, first_max)
    greedy_rows = feeds["mode"] == V.GREEDY
    np.testing.assert_array_equal(tokens[greedy_rows], want[greedy_rows])
    g_tokens, g_match = run(feeds, vocab, greedy=True)
    np.testing.assert_array_equal(g_tokens, want)  # the greedy graph treats every row as greedy
    np.testing.assert_array_equal(g_tokens[greedy_rows], tokens[greedy_rows])
    np.testing.assert_array_equal(g_match, g_tokens == feeds["draft"])


@fast
@given(seeds, st.sampled_from(VOCABS), st.integers(1, 9))
def test_a_rows_draw_depends_on_nothing_but_the_row(seed, vocab, others):
    rng = np.random.default_rng(seed)
    feeds = random_feeds(rng, TOPK_LIMIT, others + 1, vocab)
    first = run(feeds, vocab)
    again = run(feeds, vocab)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    # each row alone, and inside a shuffled batch of other random rows
    for r in range(others + 1):
        alone = run(take(feeds, [r]), vocab)
        for a, b in zip(alone, first):
            np.testing.assert_array_equal(a[0], b[r])
    perm = rng.permutation(others + 1)
    shuffled = run(take(feeds, perm), vocab)
    for a, b in zip(shuffled, first):
        np.testing.assert_array_equal(a, b[perm])
    # a row among other rows of a fresh batch, at another index
    extra = random_feeds(rng, TOPK_LIMIT, 5, vocab)
    mixed = {k: np.concatenate([extra[k][:3], feeds[k][:1], extra[k][3:]]) for k in feeds}
    inside = run(mixed, vocab)
    for a, b in zip(inside, first):
        np.testing.assert_array_equal(a[3], b[0])


@fast
@given(seeds, st.sampled_from(VOCABS))
def test_the_cheaper_variants_draw_bit_for_bit_what_the_full_graph_draws_on_rows_they_cover(seed, vocab):
    rng = np.random.default_rng(seed)
    feeds = random_feeds(rng, TOPK_LIMIT, 10, vocab)
    full = run(feeds, vocab)
    for top_k, top_p, min_p in VARIANTS[1:]:
        covered = np.ones(10, bool)
        if not top_k:
            covered &= feeds["top_k"] <= 0
        if not top_p:
            covered &= feeds["top_p"] >= 1
        if not min_p:
            covered &= feeds["min_p"] <= 0
        out = run(feeds, vocab, top_k=top_k, top_p=top_p, min_p=min_p)
        np.testing.assert_array_equal(out[0][covered], full[0][covered])  # tokens
        np.testing.assert_array_equal(out[2], full[2])  # u: the same on every row
        np.testing.assert_array_equal(out[3][covered], full[3][covered])  # candidate sets


def _agreement(feeds, vocab):
    tokens, match, u, keep, lo = run(feeds, vocab)
    ref, ref_match, d = reference_verify_sample(**feeds, top_k_limit=TOPK_LIMIT, details=True)
    np.testing.assert_array_equal(u[:, :vocab], N.hash_u(feeds["rng_counter_base"], feeds["position"], vocab))  # bit-exact
    np.testing.assert_array_equal(ref_match, ref == feeds["draft"])
    gumbel = feeds["mode"] == V.GUMBEL
    # a row may differ only where float32 vs float64 rounding can flip it: a near-tie of
    # the two best scores, or top_p within rounding of a cumulative mass / of the threshold
    fragile = gumbel & ((d["score_gap"] < 1e-4) | (d["mass_gap"] < 1e-4) | (d["lo_gap"] < 1e-4) | (d["min_p_gap"] < 1e-5))
    robust = ~fragile
    np.testing.assert_array_equal(tokens[robust], ref[robust])
    np.testing.assert_array_equal(keep[robust][:, :vocab], d["keep"][robust])
    assert (tokens >= 0).all() and (tokens < vocab).all()  # the -inf padding never wins
    return tokens == ref


@fast
@given(seeds, st.sampled_from(VOCABS))
def test_tokens_equal_the_numpy_reference(seed, vocab):
    _agreement(random_feeds(np.random.default_rng(seed), TOPK_LIMIT, 16, vocab), vocab)


def test_tokens_equal_the_numpy_reference_on_at_least_99_9_percent_of_4000_rows():
    rng = np.random.default_rng(20240611)
    same = np.concatenate([_agreement(random_feeds(rng, TOPK_LIMIT, 1000, vocab, gumbel_share=1.0), vocab) for vocab in VOCABS])
    assert same.mean() >= 0.999, same.mean()


CHI2_999 = {7: 24.32, 15: 37.70}  # chi-square 0.999 quantiles by degrees of freedom


def _frequencies(feeds, vocab):
    tokens = run(feeds, vocab)[0]
    return np.bincount(tokens, minlength=vocab) / tokens.size, tokens


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_gumbel_frequencies_match_the_softmax(temperature):
    logits = np.array([1.5, 0.2, -0.4, 0.9, 0.0, -1.2, 0.6, 0.3], np.float32)
    n = 40000
    freq, _ = _frequencies(gumbel_rows(n, 8, logits, temperature=temperature), 8)
    p = softmax(logits.astype(np.float64) / temperature)
    chi2 = n * np.sum((freq - p) ** 2 / p)
    assert chi2 < CHI2_999[7], (chi2, freq, p)
    assert 0.5 * np.abs(freq - p).sum() < 0.01


def test_top_k_and_top_p_restrict_the_candidates():
    logits = np.array([0.3, 2.0, 1.1, -0.5, 1.7, 0.0, 0.9, -2.0], np.float32)
    n = 8000
    # top_k=1 is the argmax
    _, tokens = _frequencies(gumbel_rows(n, 8, logits, top_k=1), 8)
    assert set(tokens.tolist()) == {1}
    # top_k=3: only the three largest, each at its renormalized rate
    freq, tokens = _frequencies(gumbel_rows(n, 8, logits, top_k=3, temperature=0.8), 8)
    assert set(tokens.tolist()) == {1, 4, 2}
    p3 = softmax(logits[[1, 4, 2]].astype(np.float64) / 0.8)
    assert np.abs(freq[[1, 4, 2]] - p3).max() < 0.03
    # top_p=0.5 where the top token holds 0.6: always it
    probs = np.array([0.6, 0.2, 0.1, 0.05, 0.03, 0.01, 0.005, 0.005])
    lp = np.log(probs).astype(np.float32)
    _, tokens = _frequencies(gumbel_rows(n, 8, lp, top_p=0.5), 8)
    assert set(tokens.tolist()) == {0}
    # top_p=0.7: the nucleus is {0, 1} (0.6 < 0.7 <= 0.8), drawn 0.75 / 0.25
    freq, tokens = _frequencies(gumbel_rows(n, 8, lp, top_p=0.7), 8)
    assert set(tokens.tolist()) == {0, 1}
    assert abs(freq[0] - 0.75) < 0.03
    # top_p=1 keeps every token, even one of probability 0.005
    freq, _ = _frequencies(gumbel_rows(40000, 8, lp, top_p=1.0), 8)
    assert (freq > 0).all() and abs(freq[7] - 0.005) < 0.003
    # the argmax is always kept, however small top_p; -inf logits (a masked vocabulary) change nothing
    _, tokens = _frequencies(gumbel_rows(n, 8, lp, top_p=1e-6), 8)
    assert set(tokens.tolist()) == {0}
    masked = np.concatenate([lp[:5], np.full(3, -np.inf, np.float32)])
    _, tokens = _frequencies(gumbel_rows(n, 8, masked, top_p=0.5), 8)
    assert set(tokens.tolist()) == {0}
    freq, tokens = _frequencies(gumbel_rows(n, 8, masked), 8)
    assert set(tokens.tolist()) == {0, 1, 2, 3, 4}
    # top-p applies to the top-k-filtered distribution: top_k=2 renormalizes {0: .75, 1: .25}, top_p=0.7 -> {0}
    _, tokens = _frequencies(gumbel_rows(n, 8, lp, top_k=2, top_p=0.7), 8)
    assert set(tokens.tolist()) == {0}


def test_min_p_keeps_the_tokens_within_min_p_of_the_most_likely_and_combines_with_top_k_and_top_p():
    probs = np.array([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.015, 0.005])
    lp = np.log(probs).astype(np.float32)
    n = 8000
    # min_p = 0.3: p >= 0.12 -> {0, 1, 2}, drawn at their renormalized rates
    freq, tokens = _frequencies(gumbel_rows(n, 8, lp, min_p=0.3), 8)
    assert set(tokens.tolist()) == {0, 1, 2}
    assert np.abs(freq[:3] - probs[:3] / probs[:3].sum()).max() < 0.03
    # applied after temperature: at T = 0.5 the ratios square, p/p_max >= 0.3 -> {0, 1}
    _, tokens = _frequencies(gumbel_rows(n, 8, lp, min_p=0.3, temperature=0.5), 8)
    assert set(tokens.tolist()) == {0, 1}
    # min_p = 1 keeps only the argmax; min_p = 0 keeps everything
    _, tokens = _frequencies(gumbel_rows(n, 8, lp, min_p=1.0), 8)
    assert set(tokens.tolist()) == {0}
    freq, _ = _frequencies(gumbel_rows(40000, 8, lp, min_p=0.0), 8)
    assert (freq > 0).all()
    # with top_k = 2 the tighter filter wins; top_p runs over what both keep: {0, 1, 2} at
    # 0.5 / 0.3125 / 0.1875, top_p = 0.7 -> {0, 1}
    _, tokens = _frequencies(gumbel_rows(n, 8, lp, min_p=0.3, top_k=2), 8)
    assert set(tokens.tolist()) == {0, 1}
    _, tokens = _frequencies(gumbel_rows(n, 8, lp, min_p=0.3, top_p=0.7), 8)
    assert set(tokens.tolist()) == {0, 1}
    # greedy rows ignore it
    f = gumbel_rows(16, 8, lp[::-1].copy(), min_p=1.0)
    f["mode"][:] = V.GREEDY
    assert set(run(f, 8)[0].tolist()) == {7}


def test_ties_at_the_top_k_threshold_are_kept():
    logits = np.array([2.0, 1.0, 1.0, 1.0, 0.0, -1.0, -1.0, 3.0], np.float32)
    _, tokens = _frequencies(gumbel_rows(4000, 8, logits, top_k=2), 8)
    assert set(tokens.tolist()) == {7, 0}
    _, tokens = _frequencies(gumbel_rows(8000, 8, logits, top_k=3), 8)
    assert set(tokens.tolist()) == {7, 0, 1, 2, 3}  # the third value 1.0 is shared by three tokens


# The hash's quality. Every test below fails when its statistic passes the 0.999 quantile of
# its distribution under a perfect hash (a 0.1% false-alarm rate for a random function; the
# inputs are fixed, so a pass stays a pass). hash_u is the graph's u bit for bit
# (test_the_three_forms_of_the_hash_agree), so the big samples use it directly.


def chi2_999(dof: int) -> float:
    """The 0.999 quantile of chi-square with ``dof`` degrees of freedom (Wilson-Hilferty; within
    0.1% for dof >= 60, 1% below: CHI2_999 has the exact small ones)."""
    if dof in CHI2_999:
        return CHI2_999[dof]
    z = 3.090232  # the 0.999 normal quantile
    return dof * (1 - 2 / (9 * dof) + z * np.sqrt(2 / (9 * dof))) ** 3


def chi2(counts) -> float:
    counts = np.asarray(counts, np.float64)
    expected = counts.sum() / counts.size
    return float(np.sum((counts - expected) ** 2 / expected))


def pair_chi2(a, b, buckets=16) -> float:
    """Chi-square of the joint histogram of two u samples (``buckets``**2 cells): independence."""
    cells = (np.asarray(a) * buckets).astype(int) * buckets + (np.asarray(b) * buckets).astype(int)
    return chi2(np.bincount(cells.ravel(), minlength=buckets * buckets))


EXTREME_KEYS = np.array([0, 1, 2**62, 2**63 - 2, 2**63 - 1], np.int64)
EXTREME_POSITIONS = np.array([0, 1, 2**30, 2**31 - 2, 2**31 - 1], np.int64)


def some_rows(n: int, seed: int):
    """(keys, positions): the extremes first, then random ones."""
    rng = np.random.default_rng(seed)
    keys = np.concatenate([EXTREME_KEYS, rng.integers(0, 2**63 - 1, n - 5, dtype=np.int64, endpoint=True)])
    positions = np.concatenate([EXTREME_POSITIONS, rng.integers(0, 2**31, n - 5, dtype=np.int64)])
    return keys, positions


def test_u_is_uniform_in_every_row_and_overall():
    vocab = 4096
    keys, positions = some_rows(256, 1)
    u = N.hash_u(keys, positions, vocab)
    assert u.min() >= 2.0**-24 and u.max() <= 1 - 2.0**-24
    per_row = [chi2(np.bincount((row * 64).astype(int), minlength=64)) for row in u]
    assert max(per_row[:5]) < chi2_999(63), per_row[:5]  # the extreme keys and positions, each alone
    assert sum(per_row) < chi2_999(63 * len(per_row)), sum(per_row)  # all rows together
    assert chi2(np.bincount((u.ravel() * 1024).astype(int), minlength=1024)) < chi2_999(1023)  # pooled, finer


def test_u_of_neighbouring_tokens_is_independent():
    keys, positions = some_rows(256, 2)
    u = N.hash_u(keys, positions, 4096)
    left, right = u[:, :-1], u[:, 1:]
    assert pair_chi2(left, right) < chi2_999(255)
    assert abs(np.corrcoef(left.ravel(), right.ravel())[0, 1]) < 0.01  # ~10 standard errors


@pytest.mark.parametrize("neighbour", ["position", "key"])
def test_u_of_neighbouring_positions_and_keys_is_independent(neighbour):
    keys, positions = some_rows(200, 3)
    positions = np.minimum(positions, 2**31 - 2)  # room for position + 1
    keys = np.minimum(keys, 2**63 - 2)  # room for key + 1
    a = N.hash_u(keys, positions, 4096)
    b = N.hash_u(keys, positions + 1, 4096) if neighbour == "position" else N.hash_u(keys + 1, positions, 4096)
    assert pair_chi2(a, b) < chi2_999(255)
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.01


def test_every_token_wins_the_argmax_equally_often():
    """Gumbel-max needs the tokens' noise jointly independent within a row: with equal
    logits every token must win equally often, over a lane's consecutive positions."""
    u = N.hash_u(np.full(20000, 12345), np.arange(20000), 64)
    assert chi2(np.bincount(u.argmax(axis=1), minlength=64)) < chi2_999(63)
    assert chi2(np.bincount(u[:, :8].argmax(axis=1), minlength=8)) < chi2_999(7)  # neighbouring ids
    h = np.rint(u[:, 0] * 2**N.U_BITS - 0.5).astype(np.int64)  # each bit of one token's h is a fair coin
    bits = np.stack([(h >> j) & 1 for j in range(N.U_BITS)]).mean(axis=1)
    assert np.abs(bits - 0.5).max() < 4 * 0.5 / np.sqrt(h.size), bits


def test_the_three_forms_of_the_hash_agree():
    """The graph's u, the numpy hash_u and the Python-int hash_bits, bit for bit, at the
    domain's corners (keys 0 and 2**63 - 1, positions 0 and 2**31 - 1, first and last token)."""
    vocab = 37
    k = np.repeat(EXTREME_KEYS, EXTREME_POSITIONS.size)
    p = np.tile(EXTREME_POSITIONS, EXTREME_KEYS.size)
    feeds = gumbel_rows(k.size, vocab, np.zeros(vocab))
    feeds["rng_counter_base"], feeds["position"] = k, p
    u = run(feeds, vocab)[2][:, :vocab]
    np.testing.assert_array_equal(u, N.hash_u(k, p, vocab))
    for r in range(k.size):
        for tok in (0, 1, vocab - 1):
            assert u[r, tok] == (N.hash_bits(int(k[r]), int(p[r]), tok) + 0.5) * 2.0**-N.U_BITS
    assert len({row.tobytes() for row in u}) == k.size  # every (key, position) draws its own noise
    # keys that agree in their low 30 or 60 bits, or differ only in the top bit, still differ
    u = N.hash_u(np.array([5, 5 + 2**30, 5 + 2**60, 5 + 2**62]), np.zeros(4, np.int64), 64)
    assert len({row.tobytes() for row in u}) == 4


def test_noise_keys_stay_in_the_ranges_the_graph_declares():
    from sf_trt.graphs.ranges import declared_ranges

    keys, positions = some_rows(4096, 4)
    add, mul = N.noise_keys(keys, positions)
    assert add.dtype == mul.dtype == np.int32 and add.shape == mul.shape == (4096, N.ROUNDS)
    inputs, _ = declared_ranges(V.build_verify_graph(37, TOPK_LIMIT))
    assert inputs == {V.NOISE_ADD: (0, N.LIMB - 1), V.NOISE_MUL: N.MUL_RANGE}
    assert 0 <= add.min() and add.max() <= N.LIMB - 1 and np.unique(add).size > 0.9 * N.LIMB  # 12288 draws
    assert mul.min() == N.MUL_RANGE[0] and mul.max() == N.MUL_RANGE[1] and (mul % 2 == 1).all()
    # the token states are distinct (a bijection of [0, 2**24), checked here on 2**20 ids)
    a, b = N.token_states(2**20)
    assert np.unique(a.astype(np.int64) * N.LIMB + b).size == 2**20


@fast
@given(seeds, st.sampled_from(VOCABS))
def test_match_is_tokens_equal_draft_and_minus_one_never_matches(seed, vocab):
    rng = np.random.default_rng(seed)
    feeds = random_feeds(rng, TOPK_LIMIT, 12, vocab)
    tokens = run(feeds, vocab)[0]
    feeds["draft"] = np.where(rng.random(12) < 0.5, tokens, feeds["draft"])  # many hits
    feeds["draft"][:3] = -1
    feeds["draft"][3] = tokens[3]  # at least one (the coin flips above miss all 9 rows 1 time in 512)
    for greedy in (False, True):
        t, match = run(feeds, vocab, greedy=greedy)[:2]
        assert match.dtype == np.bool_
        np.testing.assert_array_equal(match, t == feeds["draft"])
        assert not match[:3].any()
    assert run(feeds, vocab)[1][3:].any()


def sample_rows(feeds) -> SampleRows:
    return SampleRows(**{k: feeds[k] for k in SAMPLE_FIELDS})


def test_optimization_level_and_threads_change_no_bit():
    vocab = 300
    model = V.build_verify_graph(vocab, TOPK_LIMIT, debug=True).SerializeToString()
    feeds = random_feeds(np.random.default_rng(11), TOPK_LIMIT, 40, vocab)
    outs = []
    for threads, level in ((1, ort.GraphOptimizationLevel.ORT_DISABLE_ALL), (1, ort.GraphOptimizationLevel.ORT_ENABLE_ALL), (2, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.graph_optimization_level = threads, level
        outs.append(ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"]).run(None, graph_feeds(feeds)))
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            np.testing.assert_array_equal(a, b)


def test_noise_keys_are_the_same_for_few_rows_and_for_many():
    """Up to a few rows they are hashed in Python ints, beyond in numpy: the same keys."""
    keys, positions = some_rows(64, 5)
    add, mul = N.noise_keys(keys, positions)
    for r in range(0, 64, 3):
        for n in (1, 2, 4):
            few = N.noise_keys(keys[r : r + n], positions[r : r + n])
            np.testing.assert_array_equal(few[0], add[r : r + n])
            np.testing.assert_array_equal(few[1], mul[r : r + n])
            assert few[0].dtype == few[1].dtype == np.int32
    empty = N.noise_keys(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert empty[0].shape == empty[1].shape == (0, N.ROUNDS)


# -- the nucleus path (top-p over the largest `candidates` tokens, the bisection as fallback) ---

NUCLEUS_VARIANTS = tuple(v for v in VARIANTS if v[0] or v[1])  # the graphs with a nucleus path
FEW = (1, 4, 12, 16)  # candidates: a single one, fewer than 16 (padded Logs), 16 (none padded)


def nucleus(feeds, vocab, candidates, top_k=True, top_p=True, min_p=True):
    """(tokens, match, covered) of the nucleus path alone."""
    return session(vocab, top_k=top_k, top_p=top_p, min_p=min_p, candidates=candidates, nucleus=True).run(None, graph_feeds(feeds))


def test_the_nucleus_graphs_check_and_use_only_the_ops_in_ops_md():
    listed = ops_md_verify_ops()
    assert {"CumSum", "Gather", "ReduceMin", "Less", "Squeeze"} <= listed
    for vocab in (5, 37, 64):
        for candidates in FEW + (256,):
            for top_k, top_p, min_p in NUCLEUS_VARIANTS:
                name = f"V={vocab} C={candidates} top_k={top_k} top_p={top_p} min_p={min_p}"
                for model in (
                    V.build_candidate_graph(vocab, TOPK_LIMIT, top_k=top_k, top_p=top_p, min_p=min_p, candidates=candidates),
                    V.build_verify_graph(vocab, TOPK_LIMIT, top_k=top_k, top_p=top_p, min_p=min_p, candidates=candidates, debug=True),
                ):
                    onnx.checker.check_model(model, full_check=True)
                    used = {n.op_type for n in model.graph.node}
                    assert used <= listed, f"{name}: ops not in OPS.md: {sorted(used - listed)}"
                    errors = errors_in(check_graph(model))
                    assert {f.node for f in errors} == unread_inputs(name), (name, [str(f) for f in errors])
    with pytest.raises(ValueError, match="needs top_k or top_p"):
        V.build_candidate_graph(37, TOPK_LIMIT, top_k=False, top_p=False)


def _covered_and_uncovered(seed: int, vocab: int, candidates: int, rows: int = 200):
    feeds = random_feeds(np.random.default_rng(seed), TOPK_LIMIT, rows, vocab, gumbel_share=0.9)
    feeds["top_p"][: rows // 4] = np.float32(0.99)  # wide nuclei: many rows past few candidates
    return feeds


@pytest.mark.parametrize("candidates", FEW)
@pytest.mark.parametrize("vocab", VOCABS)
def test_both_paths_equal_the_numpy_reference_on_covered_and_uncovered_rows(vocab, candidates):
    feeds = _covered_and_uncovered(vocab * 100 + candidates, vocab, candidates)
    tokens, match, u, keep, lo = run(feeds, vocab, candidates=candidates)
    ref, ref_match, d = reference_verify_sample(**feeds, top_k_limit=TOPK_LIMIT, candidates=candidates, details=True)
    n_tokens, n_match, covered = nucleus(feeds, vocab, candidates)
    gumbel = feeds["mode"] == V.GUMBEL
    fragile = gumbel & ((d["score_gap"] < 1e-4) | (d["mass_gap"] < 1e-4) | (d["lo_gap"] < 1e-4) | (d["min_p_gap"] < 1e-5))
    robust = ~fragile
    np.testing.assert_array_equal(covered[robust], (d["covered"] | ~gumbel)[robust])
    np.testing.assert_array_equal(tokens[robust], ref[robust])
    np.testing.assert_array_equal(keep[robust][:, :vocab], d["keep"][robust])
    exact = robust & covered & gumbel  # the nucleus path's lo is a candidate's s (the bisection's is computed in float64 there)
    np.testing.assert_array_equal(lo[exact][:, 0], d["lo"][exact].astype(np.float32))
    # both kinds of Gumbel row are there, and the nucleus path alone draws what the full graph draws where it covers
    if candidates == 1:  # lo <= m, the one candidate's value: never above it
        assert not (covered & gumbel).any()
    else:
        assert (covered & gumbel).sum() >= 20 and (~covered).sum() >= (5 if candidates < vocab else 1), (covered & gumbel).sum()
    np.testing.assert_array_equal(n_tokens[covered], tokens[covered])
    np.testing.assert_array_equal(n_match[covered], match[covered])
    assert covered[~gumbel].all()


@fast
@given(seeds, st.sampled_from(VOCABS), st.sampled_from(FEW + (256,)))
def test_the_nucleus_path_draws_bit_for_bit_what_every_variant_of_the_full_graph_draws_where_it_covers(seed, vocab, candidates):
    feeds = random_feeds(np.random.default_rng(seed), TOPK_LIMIT, 12, vocab)
    full = run(feeds, vocab, candidates=candidates)
    for top_k, top_p, min_p in NUCLEUS_VARIANTS:
        rows = np.ones(12, bool)  # the rows this variant covers
        rows &= (feeds["top_k"] <= 0) | top_k
        rows &= (feeds["top_p"] >= 1) | top_p
        rows &= (feeds["min_p"] <= 0) | min_p
        variant = run(feeds, vocab, top_k=top_k, top_p=top_p, min_p=min_p, candidates=candidates)
        tokens, match, covered = nucleus(feeds, vocab, candidates, top_k, top_p, min_p)
        np.testing.assert_array_equal(variant[0][rows], full[0][rows])
        np.testing.assert_array_equal(tokens[covered & rows], full[0][covered & rows])
        np.testing.assert_array_equal(match[covered & rows], full[1][covered & rows])


@fast
@given(seeds, st.sampled_from(VOCABS), st.sampled_from(FEW + (256,)), st.integers(1, 9))
def test_the_nucleus_paths_rows_depend_on_nothing_but_the_row(seed, vocab, candidates, others):
    rng = np.random.default_rng(seed)
    feeds = random_feeds(rng, TOPK_LIMIT, others + 1, vocab)
    first = nucleus(feeds, vocab, candidates)
    for r in range(others + 1):  # each row alone: a batch of one
        for a, b in zip(nucleus(take(feeds, [r]), vocab, candidates), first):
            np.testing.assert_array_equal(a[0], b[r])
    perm = rng.permutation(others + 1)
    for a, b in zip(nucleus(take(feeds, perm), vocab, candidates), first):
        np.testing.assert_array_equal(a, b[perm])
    extra = random_feeds(rng, TOPK_LIMIT, 5, vocab)  # among other rows, at another index
    mixed = {k: np.concatenate([extra[k][:3], feeds[k][:1], extra[k][3:]]) for k in feeds}
    for a, b in zip(nucleus(mixed, vocab, candidates), first):
        np.testing.assert_array_equal(a[3], b[0])


def test_a_covered_row_keeps_the_exact_nucleus_and_an_uncovered_one_the_bisections():
    """Token 1 sits 1e-6 below token 0, and the nucleus is token 0 alone (its mass 0.5 >= top_p 0.4):
    the nucleus path keeps token 0 only; the bisection's bracket (under 3e-6 wide) keeps both."""
    logits = np.full(37, -20.0, np.float32)
    logits[0], logits[1] = 0.0, np.float32(-1e-6)
    n = 2000
    feeds = gumbel_rows(n, 37, logits, top_p=0.4)
    tokens, _, covered = nucleus(feeds, 37, 16)
    assert covered.all() and set(tokens.tolist()) == {0}
    np.testing.assert_array_equal(run(feeds, 37, candidates=16)[0], tokens)
    tokens, _, covered = nucleus(feeds, 37, 1)  # one candidate: the nucleus always reaches its last value
    assert not covered.any()
    bisected = run(feeds, 37, candidates=1)[0]
    assert set(bisected.tolist()) == {0, 1} and 0.4 < np.mean(bisected == 0) < 0.6


def test_ties_at_the_nucleus_threshold_are_all_kept_on_the_nucleus_path():
    # probabilities 0.4, 0.15 x 4: top_p 0.5 is reached inside the tied group, so all four are kept
    probs = np.array([0.4, 0.15, 0.15, 0.15, 0.15] + [1e-9] * 11)
    lp = np.log(probs / probs.sum()).astype(np.float32)
    feeds = gumbel_rows(8000, 16, lp, top_p=0.5)
    tokens, _, covered = nucleus(feeds, 16, 8)
    assert covered.all() and set(tokens.tolist()) == {0, 1, 2, 3, 4}
    freq = np.bincount(tokens, minlength=5)[:5] / tokens.size
    assert np.abs(freq - probs[:5] / probs[:5].sum()).max() < 0.03
    # a tied group that reaches the last candidate is not covered: the whole vocabulary decides
    _, _, covered = nucleus(feeds, 16, 4)
    assert not covered.any()


@fast
@given(seeds, st.sampled_from(VOCABS), st.sampled_from((4, 8)))
def test_a_top_k_limit_of_the_candidates_draws_what_the_wider_one_draws_on_rows_within_it(seed, vocab, candidates):
    """The runner's narrow graphs (top_k_limit = candidates, one TopK of the candidates' width)
    against the graphs of the full limit, on rows whose top_k is at most the candidates."""
    feeds = random_feeds(np.random.default_rng(seed), TOPK_LIMIT, 16, vocab)
    feeds["top_k"] = np.minimum(feeds["top_k"], candidates)
    wide = run(feeds, vocab, candidates=candidates)
    narrow = run(feeds, vocab, top_k_limit=candidates, candidates=candidates)
    for a, b in zip(narrow, wide):
        np.testing.assert_array_equal(a, b)
    narrow_nucleus = session(vocab, candidates, candidates=candidates, nucleus=True).run(None, graph_feeds(feeds))
    for a, b in zip(narrow_nucleus, nucleus(feeds, vocab, candidates)):
        np.testing.assert_array_equal(a, b)

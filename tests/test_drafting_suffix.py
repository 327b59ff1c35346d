"""Suffix drafting: what it proposes, where from, what its corpus keeps, and what it costs.

Exactness under the executor is tested in test_executor.py (every drafter kind);
here: the drafter and its corpus alone — continuations ranked by frequency, the
draft sized by the match, scopes that never see each other's text, the corpus
bounds with oldest out first, and drafting work per token that does not grow
with the history or the corpus.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sf_trt.abi import Status, StatusError
from sf_trt.drafting import SuffixConfig, SuffixCorpus, SuffixDrafter

SETTINGS = settings(max_examples=60, deadline=None)
CFG = SuffixConfig(max_draft=16, max_match=8, match_factor=2.0, min_prob=0.1)


def test_the_own_text_is_continued_from_its_earlier_match():
    d = SuffixDrafter(CFG, [5, 6, 7, 8, 9, 5, 6])
    assert d.propose(16) == [7, 8, 9, 5], "a 2-token match drafts up to 2 x 2 tokens"
    assert d.propose(2) == [7, 8]
    assert SuffixDrafter(CFG, [1, 2, 3]).propose(8) == [], "nothing repeats"


def test_a_finished_request_is_drafted_from_in_its_scope_only():
    corpus = SuffixCorpus(CFG)
    SuffixDrafter(CFG, [1, 2, 3, 4, 5, 6, 7, 8], corpus, "a").retire()
    assert corpus.stats("a") == (8, 1)
    assert SuffixDrafter(CFG, [9, 1, 2, 3], corpus, "a").propose(16) == [4, 5, 6, 7, 8]
    assert SuffixDrafter(CFG, [9, 1, 2, 3], corpus, "b").propose(16) == [], "scope b has no text"
    assert SuffixDrafter(CFG, [9, 1, 2, 3], corpus, None).propose(16) == [], "a private lane reads no corpus"
    SuffixDrafter(CFG, [1, 2, 3, 4], corpus, None).retire()
    assert corpus.stats("") == (0, 0) and corpus.scopes == ["a"], "... and leaves nothing behind"


def test_continuations_are_ranked_by_frequency_ties_to_the_latest():
    corpus = SuffixCorpus(CFG)
    for tail in (3, 3, 4):
        corpus.add("", [1, 2, tail, 10])
    assert SuffixDrafter(CFG, [7, 1, 2], corpus).propose(1) == [3], "3 followed [1, 2] twice, 4 once"
    corpus.add("", [1, 2, 4, 10])
    assert SuffixDrafter(CFG, [7, 1, 2], corpus).propose(1) == [4], "a tie goes to the latest"


def test_the_draft_stops_where_its_odds_fall_below_min_prob():
    corpus = SuffixCorpus(CFG)
    for tail in (3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14):  # eleven continuations, each once
        corpus.add("", [1, 2, tail])
    assert SuffixDrafter(CFG, [1, 2], corpus).propose(8) == [], "no continuation reaches 10%"
    loose = SuffixConfig(max_match=8, min_prob=0.0)
    assert len(SuffixDrafter(loose, [1, 2], SuffixCorpus(loose)).propose(8)) == 0
    corpus = SuffixCorpus(loose)
    for tail in (3, 4, 5):
        corpus.add("", [1, 2, tail])
    assert len(SuffixDrafter(loose, [1, 2], corpus).propose(8)) == 1, "then the sequence ended"


def test_the_longest_match_wins_whichever_text_it_is_in():
    corpus = SuffixCorpus(CFG)
    corpus.add("", [20, 21, 22, 23, 24, 25, 26, 27, 28])
    d = SuffixDrafter(CFG, [22, 30, 20, 21, 22], corpus)  # own text: [22] -> 30; corpus: [20, 21, 22] -> 23 ..
    assert d.propose(16) == [23, 24, 25, 26, 27, 28]


@pytest.mark.parametrize("kwargs", [
    dict(max_match=0), dict(min_match=9, max_match=8), dict(match_factor=0.0), dict(min_prob=1.5),
    dict(corpus_tokens=-1), dict(corpus_generations=0), dict(corpus_scopes=0), dict(max_draft=0), dict(max_backoff=-1),
])
def test_bad_configs_are_refused(kwargs):
    with pytest.raises(StatusError) as err:
        SuffixConfig(**kwargs)
    assert err.value.status == Status.REGISTRATION_REFUSED
    assert "SuffixConfig" in str(err.value) and next(iter(kwargs)) in str(err.value)


# -- scopes ----------------------------------------------------------------------------------

small_texts = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=30), max_size=6)


@SETTINGS
@given(a_texts=small_texts, b_texts=small_texts, b_at=st.lists(st.integers(0, 40), max_size=6),
       stream=st.lists(st.integers(0, 5), max_size=40), k=st.integers(1, 8),
       cfg=st.builds(SuffixConfig, max_match=st.integers(1, 6), min_prob=st.sampled_from([0.0, 0.1]),
                     corpus_tokens=st.sampled_from([16, 64, 1 << 20]), corpus_requests=st.sampled_from([1, 3, 100]),
                     corpus_generations=st.integers(1, 3), corpus_scopes=st.integers(2, 4)))
def test_a_lane_in_scope_a_never_drafts_from_scope_b(a_texts, b_texts, b_at, stream, k, cfg):
    """Scope b's text, added before or while the lane runs, changes none of its drafts."""
    with_b, without_b = SuffixCorpus(cfg), SuffixCorpus(cfg)
    for text in a_texts:
        with_b.add("a", text)
        without_b.add("a", text)
    lanes = [SuffixDrafter(cfg, [], corpus, "a") for corpus in (with_b, without_b)]
    b_queue = list(zip(b_at, b_texts))
    for step, tok in enumerate(stream):
        for at, text in b_queue:
            if at == step:
                with_b.add("b", text)
        drafts = [lane.propose(k) for lane in lanes]
        assert drafts[0] == drafts[1]
        for lane in lanes:
            lane.extend([tok])
            lane.observe(len(drafts[0]), min(len(drafts[0]), step % 3))


# -- the corpus bound ----------------------------------------------------------------------------


@SETTINGS
@given(adds=st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 25)), max_size=40),
       cfg=st.builds(SuffixConfig, max_match=st.just(4), corpus_tokens=st.sampled_from([0, 10, 40, 200]),
                     corpus_requests=st.sampled_from([1, 2, 5, 50]), corpus_generations=st.integers(1, 4),
                     corpus_scopes=st.integers(1, 3)))
def test_the_corpus_keeps_its_bounds_and_the_newest_requests(adds, cfg):
    """Each request ends with a marker pair of its own; a request is kept iff a lane of
    its scope drafts the marker's second half from its first."""
    corpus = SuffixCorpus(cfg)
    added: dict[str, list[int]] = {}  # scope -> request numbers, oldest first
    for j, (scope, n) in enumerate(adds):
        corpus.add(scope, [0] * n + [1000 + 2 * j, 1001 + 2 * j])
        added.setdefault(scope, []).append(j)
        corpus.check_integrity()
        tokens, requests = corpus.stats(scope)
        assert tokens <= cfg.corpus_tokens and requests <= cfg.corpus_requests
        assert len(corpus.scopes) <= cfg.corpus_scopes
    for scope, numbers in added.items():
        kept = corpus.stats(scope)[1]
        for rank, j in enumerate(numbers):
            draft = SuffixDrafter(cfg, [1000 + 2 * j], corpus, scope).propose(1)
            assert (draft == [1001 + 2 * j]) == (rank >= len(numbers) - kept), f"request {j} of scope {scope!r}"
    if adds and cfg.corpus_tokens and cfg.corpus_scopes >= 3:
        assert corpus.stats(adds[-1][0])[1] >= 1, "the newest request is always kept"


def test_eviction_drops_the_oldest_generation_whole():
    cfg = SuffixConfig(corpus_tokens=100, corpus_requests=1000, corpus_generations=4)
    corpus = SuffixCorpus(cfg)
    for j in range(40):
        corpus.add("", [j] * 10)
    tokens, requests = corpus.stats("")
    assert 60 <= tokens <= 100, "an eviction drops about a generation's share"
    assert len(corpus.generations("")) <= 4 + 1
    assert [g.gen_id for g in corpus.generations("")] == sorted(g.gen_id for g in corpus.generations(""))


# -- cost per token ------------------------------------------------------------------------------


def text_like(rng: random.Random, n: int) -> list[int]:
    phrases = [[rng.randrange(4096) for _ in range(rng.randrange(3, 12))] for _ in range(300)]
    out: list[int] = []
    while len(out) < n:
        out.extend(phrases[rng.randrange(300)] if rng.random() < 0.7 else [rng.randrange(4096)])
    return out[:n]


def drafting_work(history_len: int, corpus_len: int, steps: int = 1500) -> tuple[float, float]:
    """States visited (``SuffixAutomaton.work``) per token appended, and per token
    proposed (plus one per proposal), over a decode-like loop: append a token,
    propose up to 16."""
    rng = random.Random(7)
    cfg = SuffixConfig(corpus_tokens=1 << 20)
    corpus = SuffixCorpus(cfg)
    text = text_like(rng, corpus_len + history_len + steps)
    for lo in range(0, corpus_len, 1000):
        corpus.add("", text[lo : min(lo + 1000, corpus_len)])
    drafter = SuffixDrafter(cfg, text[corpus_len : corpus_len + history_len], corpus)
    drafter.propose(16)  # cursors matched once
    automata = [drafter.own] + [g.automaton for g in corpus.generations("")]

    def work() -> int:
        return sum(a.work for a in automata)

    extend = propose = proposed = 0
    for tok in text[corpus_len + history_len :]:
        before = work()
        drafter.extend([tok])
        extend += work() - before
        before = work()
        proposed += len(drafter.propose(16)) + 1
        propose += work() - before
    return extend / steps, propose / proposed


def test_drafting_work_per_token_does_not_grow_with_the_history_or_the_corpus():
    """O(window) per token appended to the own automaton plus a cursor step per
    corpus generation (at most corpus_generations + 1), O(k) per k tokens proposed."""
    cfg = SuffixConfig(corpus_tokens=1 << 20)
    small = drafting_work(1_000, 1_000)
    large = drafting_work(32_768, 300_000)
    bound = 2 * (cfg.max_match + 2) + 4 + (cfg.corpus_generations + 1) * 4
    assert small[0] <= bound and large[0] <= bound, f"appending: {large[0]:.1f} states per token at 32k / 300k, {small[0]:.1f} at 1k / 1k"
    assert large[1] <= 2.0 * small[1] and large[1] <= 2 * (cfg.corpus_generations + 2), (
        f"proposing: {large[1]:.1f} states per token at 32k / 300k, {small[1]:.1f} at 1k / 1k")

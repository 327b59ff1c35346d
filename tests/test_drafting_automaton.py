"""The suffix automaton against brute force: counts, best continuations, matching.

Every property is checked against its definition computed by rescanning the
text, over random texts on small alphabets (so substrings repeat), with
separators, and at every window size that matters.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sf_trt.drafting.automaton import SEP, SuffixAutomaton

SETTINGS = settings(max_examples=150, deadline=None)

texts = st.lists(st.one_of(st.integers(0, 3), st.just(SEP)), max_size=70)
windows = st.integers(1, 6)


def occurrences(text: list[int], s: tuple[int, ...]) -> list[int]:
    """End positions of ``s`` in ``text``."""
    n = len(s)
    return [e for e in range(n - 1, len(text)) if tuple(text[e - n + 1 : e + 1]) == s]


def walk(sam: SuffixAutomaton, s: tuple[int, ...]) -> int:
    state = 0
    for x in s:
        state = sam.next_state(state, x)
        assert state >= 0
    return state


def substrings(text: list[int], max_len: int) -> set[tuple[int, ...]]:
    return {tuple(text[i : i + n]) for n in range(1, max_len + 1) for i in range(len(text) - n + 1)}


def best_by_rescan(text: list[int], s: tuple[int, ...]) -> tuple[int, int]:
    """The token that most often followed ``s`` (ties: the latest), and its count; (-1, 0) if none."""
    follow: dict[int, tuple[int, int]] = {}
    for e in occurrences(text, s):
        if e + 1 < len(text):
            c = text[e + 1]
            cnt, _ = follow.get(c, (0, -1))
            follow[c] = (cnt + 1, e + 1)
    if not follow:
        return -1, 0
    token = max(follow, key=lambda c: follow[c])
    return token, follow[token][0]


@SETTINGS
@given(text=texts, window=windows, split=st.integers(0, 70))
def test_counts_and_best_continuations_are_what_a_rescan_finds(text, window, split):
    sam = SuffixAutomaton(window, text[:split])
    sam.extend(text[split:])
    assert sam.positions == len(text)
    assert sam.num_states <= max(2 * len(text), 1)
    for s in substrings(text, window + 1):
        state = walk(sam, s)
        assert sam.count(state) == len(occurrences(text, s)), s
        if len(s) <= window:
            assert (sam._best[state], sam._best_count[state]) == best_by_rescan(text, s), s


@SETTINGS
@given(text=texts, query=st.lists(st.integers(0, 4), max_size=20), window=windows)
def test_matching_finds_the_longest_suffix_of_the_query_that_occurs(text, query, window):
    sam = SuffixAutomaton(window, text)
    state, matched = 0, 0
    for i, x in enumerate(query):
        state, matched = sam.step(state, matched, x)
        prefix = query[: i + 1]
        want = max((n for n in range(0, min(window, len(prefix)) + 1) if n == 0 or occurrences(text, tuple(prefix[-n:]))), default=0)
        assert matched == want
        if matched:
            assert state == walk(sam, tuple(prefix[-matched:]))
    assert sam.match(query) == (state, matched)


@SETTINGS
@given(text=st.lists(st.integers(0, 3), max_size=60), window=windows)
def test_the_earlier_match_is_the_longest_suffix_that_ended_before(text, window):
    sam = SuffixAutomaton(window, text)
    state, matched = sam.earlier_match()
    want = 0
    for n in range(1, min(window, len(text) - 1) + 1):
        if any(e < len(text) - 1 for e in occurrences(text, tuple(text[-n:]))):
            want = n
    assert matched == want
    if matched:
        assert state == walk(sam, tuple(text[-matched:]))


@SETTINGS
@given(text=texts, query=st.lists(st.integers(0, 3), min_size=1, max_size=8), window=windows,
       k=st.integers(0, 10), min_prob=st.sampled_from([0.0, 0.1, 0.3, 0.6]))
def test_a_continuation_follows_the_most_frequent_next_token_while_likely(text, query, window, k, min_prob):
    sam = SuffixAutomaton(window, text)
    state, matched = sam.match(query)
    draft, score = sam.continue_from(state, matched, k, min_prob)
    # By rescan: the context is the last `matched` tokens of query + draft, capped at the window.
    context = list(query[len(query) - matched :]) if matched else []
    want, prob, want_score = [], 1.0, 0.0
    while context and len(want) < k:
        token, cnt = best_by_rescan(text, tuple(context))
        if token < 0:
            break
        prob *= cnt / len(occurrences(text, tuple(context)))
        if prob < min_prob:
            break
        want.append(token)
        want_score += prob
        context = (context + [token])[-window:]
    assert draft == want
    assert abs(score - want_score) < 1e-9
    assert SEP not in draft


def test_separators_end_continuations_and_never_match():
    sam = SuffixAutomaton(4, [1, 2, 3, SEP, 1, 2, 3, SEP, 1, 2, 9])
    state, matched = sam.match([1, 2])
    assert matched == 2
    draft, _ = sam.continue_from(state, matched, 8, 0.0)
    assert draft == [3], "3 followed [1, 2] twice, then the sequences ended"
    assert sam.match([3, SEP + 10])[1] == 0

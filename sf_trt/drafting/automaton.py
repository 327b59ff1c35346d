"""An online suffix automaton over a token stream, with windowed occurrence counts.

The automaton (Blumer et al.'s DAWG, built online as in the textbook
construction) has one state per class of substrings that end at the same set of
positions (their *endpos*), at most ``2n`` states and ``3n`` transitions for ``n``
tokens, and is extended one token at a time in O(1) amortized steps.

On top of it this module keeps what a drafter needs, for contexts up to
``window`` (W) tokens:

- ``count[v]``: how many times the strings of state ``v`` occur (``|endpos(v)|``),
  kept exact for every state whose shortest string has at most W + 1 tokens;
- ``best[v]``: the token that most often followed ``v``'s strings (ties: the one
  seen last), with ``best_count[v]`` its count, for every state whose shortest
  string has at most W tokens.

Appending token ``x`` at position ``n`` adds ``n`` to the endpos of exactly the
states on the suffix-link path of the text's suffixes; only the part of that
path holding suffixes of at most W + 1 tokens is walked (at most W + 2 states),
starting from a cursor on the length-(W + 1) suffix (``_tail``). The parents of
those suffixes (one token shorter) are the matching part of the previous path,
walked once to update ``best``. So an append costs O(W) steps whatever the text
length, and a state's counts and best child are never recomputed.

Matching (``step``) runs the classic matching-statistics walk: a cursor
``(state, length)`` for the longest suffix of a query (capped at W) that occurs
in the text, advanced by one query token in O(1) amortized steps.
Continuing (``continue_from``) follows ``best`` from a cursor: O(k) for k tokens.

Transitions are stored compactly because most states have one: the first
transition of each state inline in two arrays, the others in a dict per
branching state (about a fifth of the states on real text).
"""

from __future__ import annotations

from array import array
from typing import Iterable

SEP = -2
"""Ends one sequence in a corpus automaton: never a token, so never matched, never drafted."""
_NONE = -1


class SuffixAutomaton:
    """A suffix automaton over tokens (ints >= 0, or :data:`SEP`), with windowed counts.

    ``window`` (W >= 1) is the longest context whose continuations are ranked.
    Instances only grow; a corpus bounds them by dropping whole automata.
    """

    __slots__ = ("window", "_len", "_link", "_count", "_best", "_best_count", "_tok", "_to", "_more",
                 "_last", "_tail", "_tail_len", "positions", "work")

    def __init__(self, window: int, tokens: Iterable[int] = ()) -> None:
        self.window = window
        self._len = array("i", [0])  # longest string of each state
        self._link = array("i", [-1])  # suffix link (root: -1)
        self._count = array("i", [0])
        self._best = array("i", [_NONE])
        self._best_count = array("i", [0])
        self._tok = array("i", [_NONE])  # first transition: token ...
        self._to = array("i", [0])  # ... and target
        self._more: dict[int, dict[int, int]] = {}  # further transitions of branching states
        self._last = 0  # the state of the whole text
        self._tail = 0  # the state of the text's last _tail_len = min(W + 1, n) tokens
        self._tail_len = 0
        self.positions = 0
        self.work = 0
        """States visited so far by appends, cursor steps and continuations (a cost
        tally for tests and benchmarks: the steps that could grow with the text)."""
        self.extend(tokens)

    @property
    def num_states(self) -> int:
        return len(self._len)

    # -- transitions --------------------------------------------------------------------

    def next_state(self, state: int, token: int) -> int:
        """The state reached from ``state`` by ``token``, or -1."""
        if self._tok[state] == token:
            return self._to[state]
        more = self._more.get(state)
        return -1 if more is None else more.get(token, -1)

    def _set(self, state: int, token: int, target: int) -> None:
        first = self._tok[state]
        if first == token or first == _NONE:
            self._tok[state] = token
            self._to[state] = target
        else:
            self._more.setdefault(state, {})[token] = target

    def _new_state(self, length: int, link: int, like: int = -1) -> int:
        """A state; ``like``: a state whose transitions, counts and best child it copies."""
        v = len(self._len)
        self._len.append(length)
        self._link.append(link)
        if like < 0:
            for arr, value in ((self._count, 0), (self._best, _NONE), (self._best_count, 0), (self._tok, _NONE), (self._to, 0)):
                arr.append(value)
        else:
            for arr in (self._count, self._best, self._best_count, self._tok, self._to):
                arr.append(arr[like])
            if like in self._more:
                self._more[v] = dict(self._more[like])
        return v

    # -- growing ----------------------------------------------------------------------------

    def extend(self, tokens: Iterable[int]) -> None:
        for x in tokens:
            self.append(x)

    def append(self, x: int) -> None:
        """Append one token (an int >= 0, or SEP) at position ``positions``."""
        self._grow(x)
        self._count_suffixes(x)
        self.positions += 1

    def _grow(self, x: int) -> None:
        """The online construction: a state for the new text, clones where classes split."""
        length, link = self._len, self._link
        cur = self._new_state(length[self._last] + 1, 0)
        p = self._last
        visited = 1
        while p >= 0 and self.next_state(p, x) < 0:
            self._set(p, x, cur)
            p = link[p]
            visited += 1
        if p >= 0:
            q = self.next_state(p, x)
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = self._new_state(length[p] + 1, link[q], like=q)
                while p >= 0 and self.next_state(p, x) == q:
                    self._set(p, x, clone)
                    p = link[p]
                    visited += 1
                link[q] = clone
                link[cur] = clone
        self._last = cur
        self.work += visited

    def _count_suffixes(self, x: int) -> None:
        """Add the new position to the counts of the suffixes of <= W + 1 tokens, and
        update the best child of their parents (the previous suffixes of <= W tokens)."""
        length, link, count = self._len, self._link, self._count
        best, best_count, tok, to, more = self._best, self._best_count, self._tok, self._to, self._more
        window = self.window
        t, n = self._tail, self._tail_len  # the previous length-n suffix
        while t and n <= length[link[t]]:  # a clone may have taken it over
            t = link[t]
        # Parents: the previous suffixes of min(W, n) tokens and shorter.
        p = t
        if n > window and length[link[p]] >= window:
            p = link[p]
        # The new tail: the suffix of min(W + 1, n + 1) tokens.
        t = self.next_state(t, x)
        n += 1
        if n > window + 1:
            n = window + 1
            if length[link[t]] >= n:
                t = link[t]
        self._tail, self._tail_len = t, n
        visited = 0
        while t > 0:
            count[t] += 1
            t = link[t]
            visited += 1
        while p >= 0:
            if tok[p] == x:
                c = count[to[p]]
            else:
                c = count[more[p][x]]
            if best[p] == x or c >= best_count[p]:
                best[p] = x
                best_count[p] = c
            p = link[p]
            visited += 1
        self.work += visited

    # -- reading ------------------------------------------------------------------------------

    def step(self, state: int, matched: int, x: int) -> tuple[int, int]:
        """Advance a matching cursor by query token ``x``: the longest suffix of the
        query (at most W tokens) that occurs in the text, as ``(state, length)``."""
        tok, to, more, link = self._tok, self._to, self._more, self._link  # next_state, inlined: the hot path
        self.work += 1
        while True:
            if tok[state] == x:
                nxt = to[state]
                break
            m = more.get(state)
            if m is not None and x in m:
                nxt = m[x]
                break
            if not state:
                return 0, 0
            state = link[state]
            matched = self._len[state]
            self.work += 1
        matched += 1
        if matched > self.window:
            matched = self.window
            if self._len[link[nxt]] >= matched:
                nxt = link[nxt]
        return nxt, matched

    def match(self, query: Iterable[int]) -> tuple[int, int]:
        """The cursor of the longest suffix of ``query`` (at most W tokens) in the text."""
        state, matched = 0, 0
        for x in query:
            state, matched = self.step(state, matched, x)
        return state, matched

    def earlier_match(self) -> tuple[int, int]:
        """The cursor of the longest suffix of the text (at most W tokens) that also
        ends earlier in the text: what a lane drafting from its own tokens continues."""
        if self._last == 0:
            return 0, 0
        state = self._link[self._last]
        matched = self._len[state]
        if matched <= self.window:
            return state, matched
        state = self._tail  # holds the last W + 1 tokens; step down to W
        if self._len[self._link[state]] >= self.window:
            state = self._link[state]
        return state, self.window

    def count(self, state: int) -> int:
        return self._count[state]

    def first_odds(self, state: int, skip_last: bool = False) -> float:
        """How often the likeliest next token followed the cursor's context (see
        :meth:`continue_from`); 0.0 when nothing did."""
        seen = self._count[state] - skip_last
        return self._best_count[state] / seen if seen > 0 and self._best[state] >= 0 else 0.0

    def continue_from(self, state: int, matched: int, max_len: int, min_prob: float, skip_last: bool = False) -> tuple[list[int], float]:
        """Follow the most frequent continuation of a cursor for up to ``max_len`` tokens.

        Each token's probability is how often it followed the context among the
        context's occurrences; the draft stops where the product falls below
        ``min_prob``, at a separator, or where nothing followed. ``skip_last``: one
        occurrence of the context is the text's own end (nothing follows it yet),
        left out of the first token's odds. Returns ``(tokens, score)``, score the
        sum of the running products (the expected number of tokens accepted).
        """
        length, link, count, best, best_count = self._len, self._link, self._count, self._best, self._best_count
        tok, to, more = self._tok, self._to, self._more
        window = self.window
        draft: list[int] = []
        prob, score = 1.0, 0.0
        seen = count[state] - skip_last
        while len(draft) < max_len and matched:
            token = best[state]
            if token < 0 or seen <= 0:
                break
            prob *= best_count[state] / seen
            if prob < min_prob:
                break
            draft.append(token)
            score += prob
            state = to[state] if tok[state] == token else more[state][token]  # best is always a transition
            matched += 1
            if matched > window:
                matched = window
                if length[link[state]] >= window:
                    state = link[state]
            seen = count[state]
        self.work += len(draft) + 1
        return draft, score

"""Suffix drafting: continue the longest match in the lane's own text or in earlier requests'.

After SuffixDecoding (arXiv 2411.04975): a lane drafts from a suffix structure
over its own tokens and from one over a *corpus* of finished requests (their
prompts and outputs), continuing the longest match with the continuation that
most often followed it, for as many tokens as the match's length and the
continuation's odds warrant. Serving workloads repeat themselves (the same
templates, tools, files and answers), and the executor verifies every draft, so
a cross-request drafter changes speed, never output.

Structures (:mod:`sf_trt.drafting.automaton`): one suffix automaton per lane
over its prompt and output, and per *scope* a few *generations* of automata
over finished requests. A new request goes into the newest generation; when the
scope holds more than ``corpus_tokens`` tokens or ``corpus_requests`` requests,
its oldest generation is dropped whole (oldest out first, O(1) per eviction: an
automaton cannot forget one string cheaply, but it can be forgotten entirely).
A generation takes requests until it holds ``1/corpus_generations`` of either
bound, so a scope has at most ``corpus_generations + 1`` automata and an
eviction drops about that share of the corpus. A lane's cost per token is
O(window + generations) however long its history and however large the corpus.

Scopes. Every lane names a scope at admission (``draft_scope``); it drafts only
from finished requests of the same scope, and its own text enters only that
scope's corpus when it is released. A server passes one scope per tenant (API
key, and the request's ``user`` when given), so one tenant's text never shapes
another tenant's drafts, and so never their timing. ``None`` is private: the lane
drafts from its own tokens only and leaves nothing behind. Scopes beyond
``corpus_scopes`` are dropped least recently used first.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from typing import Iterable, Optional

from ..abi import Status, StatusError
from ..engine import DEFAULT_SCOPE
from .automaton import SEP, SuffixAutomaton
from .base import DraftCap, DrafterBase, check_draft_config



@dataclasses.dataclass(frozen=True)
class SuffixConfig:
    """How suffix drafting drafts, and how much of the past it keeps.

    ``max_draft``: the most tokens a lane sends for verification in one pass.
    ``max_match``: the longest context matched (W); continuations are ranked by
    how often they followed the last <= W tokens.
    ``min_match``: the shortest match worth drafting from.
    ``match_factor``: a draft is at most ``match_factor x`` the match's length.
    ``min_prob``: a draft stops where the estimated odds that all of it is taken
    fall below this: about what a verify row costs, in passes (0.15 to 0.45 on
    a 2-core CPU, from 1 to 8 lanes; near 0 on a GPU, where a lower value pays).
    ``adaptive``/``max_backoff``: adapt the draft length to measured acceptance
    (:class:`~sf_trt.drafting.base.DraftCap`, gently: a rejection halves the cap).
    Defaults from replays of real token streams (``tools/bench_drafting.py``).
    ``corpus_tokens``/``corpus_requests``: per scope, the most tokens and
    requests kept (about 130 bytes a token: 256k tokens, 34 MB); ``corpus_generations``:
    automata a scope's corpus is split into (eviction drops the oldest);
    ``corpus_scopes``: scopes kept (so at most ``corpus_scopes x corpus_tokens`` tokens).
    """

    max_draft: int = 16
    max_match: int = 32
    min_match: int = 1
    match_factor: float = 1.0
    min_prob: float = 0.3
    adaptive: bool = True
    max_backoff: int = 0
    corpus_tokens: int = 1 << 18
    corpus_requests: int = 2048
    corpus_generations: int = 2
    corpus_scopes: int = 16

    def __post_init__(self) -> None:
        def refuse(what: str) -> StatusError:
            return StatusError(Status.REGISTRATION_REFUSED, f"SuffixConfig: {what}")

        check_draft_config("SuffixConfig", self.max_draft, self.max_backoff)
        ints = {
            "max_match": (1, 256), "min_match": (1, self.max_match if isinstance(self.max_match, int) else 256),
            "corpus_tokens": (0, 1 << 30), "corpus_requests": (0, 1 << 30),
            "corpus_generations": (1, 64), "corpus_scopes": (1, 1 << 16),
        }
        for name, (lo, hi) in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise refuse(f"{name} must be an int in {lo}..{hi} (got {value!r})")
        for name, (lo, hi) in {"match_factor": (0.0, 256.0), "min_prob": (0.0, 1.0)}.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise refuse(f"{name} must be a number in [{lo}, {hi}] (got {value!r})")
        if self.match_factor <= 0:
            raise refuse(f"match_factor must be > 0 (got {self.match_factor})")


@dataclasses.dataclass(eq=False)
class Generation:
    """Some consecutive finished requests of one scope, in one automaton (requests
    separated by :data:`SEP`). ``version`` counts the requests added; lanes
    re-match when it moves."""

    gen_id: int
    automaton: SuffixAutomaton
    tokens: int = 0
    requests: int = 0

    @property
    def version(self) -> int:
        return self.requests


@dataclasses.dataclass(eq=False)
class _Scope:
    generations: list[Generation] = dataclasses.field(default_factory=list)  # oldest first
    tokens: int = 0
    requests: int = 0


class SuffixCorpus:
    """Finished requests' tokens, by scope, bounded; shared by the lanes of one grant."""

    def __init__(self, cfg: SuffixConfig) -> None:
        self.cfg = cfg
        self._scopes: collections.OrderedDict[str, _Scope] = collections.OrderedDict()  # least recently used first
        self._gen_ids = itertools.count(1)
        self._gen_tokens = max(1, cfg.corpus_tokens // cfg.corpus_generations)
        self._gen_requests = max(1, cfg.corpus_requests // cfg.corpus_generations)
        self.version = 0
        """Requests added so far (the executor's snapshot reads it)."""

    def generations(self, scope: str) -> list[Generation]:
        """The scope's automata, oldest first (a lane reads them each step)."""
        s = self._scopes.get(scope)
        return s.generations if s is not None else []

    def touch(self, scope: str) -> None:
        """Mark the scope used now (scopes are dropped least recently used first)."""
        if scope in self._scopes:
            self._scopes.move_to_end(scope)

    def add(self, scope: str, tokens: Iterable[int]) -> None:
        """Keep a finished request's tokens (its last ``corpus_tokens``, at most)."""
        cfg = self.cfg
        tokens = list(tokens)[-cfg.corpus_tokens :] if cfg.corpus_tokens else []
        if not tokens or not cfg.corpus_requests:
            return
        s = self._scopes.get(scope)
        if s is None:
            s = self._scopes[scope] = _Scope()
            while len(self._scopes) > cfg.corpus_scopes:
                self._scopes.popitem(last=False)
        self._scopes.move_to_end(scope)
        gen = s.generations[-1] if s.generations else None
        if (gen is None or gen.tokens >= self._gen_tokens or gen.requests >= self._gen_requests
                or gen.tokens + len(tokens) > cfg.corpus_tokens or gen.requests >= cfg.corpus_requests):
            gen = Generation(next(self._gen_ids), SuffixAutomaton(cfg.max_match))  # the newest one is full
            s.generations.append(gen)
        gen.automaton.extend(tokens)
        gen.automaton.append(SEP)
        gen.tokens += len(tokens)
        gen.requests += 1
        s.tokens += len(tokens)
        s.requests += 1
        while s.tokens > cfg.corpus_tokens or s.requests > cfg.corpus_requests:
            old = s.generations.pop(0)  # never the newest: it fits the bounds by itself
            s.tokens -= old.tokens
            s.requests -= old.requests
        self.version += 1

    def stats(self, scope: str) -> tuple[int, int]:
        """``(tokens, requests)`` the scope keeps."""
        s = self._scopes.get(scope)
        return (s.tokens, s.requests) if s is not None else (0, 0)

    @property
    def scopes(self) -> list[str]:
        """Scopes with a corpus, least recently used first."""
        return list(self._scopes)

    def check_integrity(self) -> None:
        """Raise AssertionError if a bound or a tally is off."""
        cfg = self.cfg
        if len(self._scopes) > cfg.corpus_scopes:
            raise AssertionError(f"corpus: {len(self._scopes)} scopes kept, the bound is {cfg.corpus_scopes}")
        for name, s in self._scopes.items():
            where = f"corpus scope {name!r}"
            if s.tokens > cfg.corpus_tokens or s.requests > cfg.corpus_requests:
                raise AssertionError(f"{where}: {s.tokens} tokens / {s.requests} requests exceed {cfg.corpus_tokens} / {cfg.corpus_requests}")
            if (s.tokens, s.requests) != (sum(g.tokens for g in s.generations), sum(g.requests for g in s.generations)):
                raise AssertionError(f"{where}: tallies {s.tokens} tokens / {s.requests} requests disagree with its generations")
            for g in s.generations:
                if g.automaton.positions != g.tokens + g.requests:
                    raise AssertionError(f"{where}: generation {g.gen_id} holds {g.automaton.positions} positions, not {g.tokens} tokens + {g.requests} separators")


class SuffixDrafter(DrafterBase):
    """One lane's suffix drafter: its own automaton, and cursors into its scope's corpus."""

    __slots__ = ("_cfg", "_corpus", "_scope", "_own", "_cursors")

    def __init__(
        self,
        cfg: SuffixConfig,
        history: Iterable[int] = (),
        corpus: Optional[SuffixCorpus] = None,
        scope: Optional[str] = DEFAULT_SCOPE,
    ) -> None:
        self._cfg = cfg
        self._corpus = corpus if scope is not None else None
        self._scope = scope
        self._history: list[int] = []
        self._own = SuffixAutomaton(cfg.max_match)
        # gen_id -> [state, matched, version]: the longest suffix of the history in that generation.
        self._cursors: dict[int, list[int]] = {}
        self._cap = DraftCap(cfg.max_draft, cfg.adaptive, cfg.max_backoff, gentle=True)
        if self._corpus is not None:
            self._corpus.touch(scope)
        self.extend(history)


    @property
    def own(self) -> SuffixAutomaton:
        """The automaton of this lane's own tokens (read by benchmarks and tests)."""
        return self._own
    def _generations(self) -> list[Generation]:
        return self._corpus.generations(self._scope) if self._corpus is not None else []

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens: to the own automaton, and to each live cursor."""
        new = [int(t) for t in tokens]
        self._history.extend(new)
        self._own.extend(new)
        for gen in self._generations():
            cursor = self._cursors.get(gen.gen_id)
            if cursor is None or cursor[2] != gen.version:
                continue  # re-matched when next needed
            state, matched, sam = cursor[0], cursor[1], gen.automaton
            for x in new:
                state, matched = sam.step(state, matched, x)
            cursor[0], cursor[1] = state, matched

    def _cursor(self, gen: Generation) -> tuple[int, int]:
        """The lane's cursor in ``gen``, re-matched over the last W tokens if ``gen`` grew."""
        cursor = self._cursors.get(gen.gen_id)
        if cursor is None or cursor[2] != gen.version:
            state, matched = gen.automaton.match(self._history[-self._cfg.max_match :])
            cursor = self._cursors[gen.gen_id] = [state, matched, gen.version]
        return cursor[0], cursor[1]

    def propose(self, max_len: int) -> list[int]:
        """The continuation of the longest match in the own text or the corpus (among
        equally long ones, the draft with the most tokens expected to be accepted)."""
        if max_len <= 0 or not self._history:
            return []
        if self._cap.backing_off():  # one call per decode step
            return []
        cfg = self._cfg
        state, matched = self._own.earlier_match()
        sources = [(matched, self._own, state, True)]
        gens = self._generations()
        if len(self._cursors) > len(gens):  # generations were dropped
            live = {g.gen_id for g in gens}
            self._cursors = {k: v for k, v in self._cursors.items() if k in live}
        for gen in reversed(gens):  # newest first: ties go to the own text, then to the newest
            state, matched = self._cursor(gen)
            sources.append((matched, gen.automaton, state, False))
        sources.sort(key=lambda src: -src[0])  # longest match first (stable)
        best: list[int] = []
        best_score, best_matched = 0.0, 0
        for matched, sam, state, own in sources:
            if matched < cfg.min_match or matched < best_matched:
                break  # the longest match that drafts anything wins; ties go to the likeliest draft
            limit = min(max_len, max(1, int(cfg.match_factor * matched)))
            if limit * sam.first_odds(state, skip_last=own) <= best_score:
                continue  # cannot beat the best so far: a draft's score is at most limit x its first odds
            draft, score = sam.continue_from(state, matched, limit, cfg.min_prob, skip_last=own)
            if score > best_score:
                best, best_score, best_matched = draft, score, matched
        return best

    def retire(self) -> None:
        """Give the lane's prompt and output to its scope's corpus (once)."""
        if self._corpus is not None and self._history:
            self._corpus.add(self._scope, self._history)
        self._corpus = None
        self._cursors = {}

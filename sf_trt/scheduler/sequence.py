"""A request's progress through the scheduler (:class:`Sequence`) and what one step
added to it (:class:`Update`).

Invariant: a sequence's ``tokens`` are what its lane emitted up to the cut (a stop
token id or stop string); its ``text`` is their decoded text cut at the stop
string's start; nothing after the cut is ever reported.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..abi import Finish
from ..engine import Emit, TokenLogprobs
from ..outputs import RequestOutput
from .requests import Request

__all__ = ["Sequence", "Update", "ACCEPTANCE_PRIOR", "ACCEPTANCE_DECAY"]

@dataclasses.dataclass
class Update:
    """What one step added to one sequence: tokens, text (``None`` without a tokenizer),
    logprobs, and whether it finished (``seq.finish`` says how)."""

    seq: "Sequence"
    tokens: list[int]
    text: Optional[str]
    logprobs: Optional[TokenLogprobs]
    finished: bool


ACCEPTANCE_PRIOR = (2.0, 4.0)
"""A new lane's draft record: 2 of 4 draft tokens accepted, worth about one short draft."""
ACCEPTANCE_DECAY = 0.75
"""Each tick with drafts keeps this share of the lane's earlier record (older ticks fade)."""


class Sequence:
    """A request's progress through the scheduler: its lane, its output, its timings.

    Invariant: ``tokens`` are what the lane emitted up to the cut (a stop), and
    ``text`` is their decoded text cut at the stop string's start.
    """

    def __init__(self, seq_id: int, request: Request, prompt_len: int, decoder: Any, arrival: float) -> None:
        self.seq_id = seq_id
        self.request = request
        self.prompt_len = prompt_len
        self.prompt_id = 0  # the executor's, while registered
        self.prefilled_len = 0
        self.cached_len: Optional[int] = None
        """Prompt positions taken from the prefix cache at admission, not prefilled (None:
        the executor keeps no prefix cache)."""
        self.admitted = False
        self.tokens: list[int] = []
        self.finish = Finish.NONE
        self.stop_reason: Optional[str | int] = None
        self.error: Optional[str] = None
        self.proposed = self.accepted = self.drafts = self.passes = 0
        self.recent_accepted, self.recent_proposed = ACCEPTANCE_PRIOR
        """Draft tokens accepted and proposed, decayed by :data:`ACCEPTANCE_DECAY` each tick
        with drafts, starting from :data:`ACCEPTANCE_PRIOR` (what :attr:`acceptance` reads)."""
        self.tokens_per_pass = 1.0
        """Moving average of tokens emitted per decode pass in ticks the lane could draft in."""
        self.draft_rows_per_pass = 0.0
        """Moving average of draft tokens sent per decode pass in ticks the lane could draft in."""
        self.drafted_ticks = 0
        """Ticks the lane could draft in (the drafter may have found nothing to propose)."""
        self.ticks_since_draft = 0
        """Decoding ticks since the lane last could draft (the drafting policy's probes read it)."""
        self.may_draft = False  # in the current tick
        self.logprobs_parts: list[TokenLogprobs] = []
        self.prompt_logprobs_parts: list[TokenLogprobs] = []
        self._prompt_logprobs_taken = False
        self._decoder = decoder
        self.text: Optional[str] = "" if decoder is not None else None
        self._text_sent = 0
        self._holdback = max((len(s) for s in request.stop), default=1) - 1
        self._stop_ids = frozenset(request.stop_token_ids)
        self.arrival = arrival
        self.admitted_at: Optional[float] = None
        self.first_token_at: Optional[float] = None
        self.finished_at: Optional[float] = None

    @property
    def decoding(self) -> bool:
        return self.admitted and self.prefilled_len == self.prompt_len

    @property
    def acceptance(self) -> float:
        """The share of recent draft tokens accepted (the prior's 0.5 before any drafts)."""
        return self.recent_accepted / self.recent_proposed

    @property
    def logprobs(self) -> Optional[TokenLogprobs]:
        if self.request.logprobs is None:
            return None
        return TokenLogprobs.concat(self.logprobs_parts, self.request.logprobs)

    @property
    def prompt_logprobs(self) -> Optional[TokenLogprobs]:
        """The prompt tokens' logprobs after the first (those prefilled so far)."""
        if self.request.prompt_logprobs is None:
            return None
        return TokenLogprobs.concat(self.prompt_logprobs_parts, self.request.prompt_logprobs)

    def take_prompt_logprobs(self) -> Optional[TokenLogprobs]:
        """:attr:`prompt_logprobs` the first time it is asked for, None after (and without them)."""
        if self.request.prompt_logprobs is None or self._prompt_logprobs_taken:
            return None
        self._prompt_logprobs_taken = True
        return self.prompt_logprobs

    def _append(self, new: list[int]) -> int:
        """Push ``new`` through the stop checks; how many of them the output keeps.
        Before ``params.min_tokens`` tokens no stop applies (vLLM's rule; the sampler holds
        the stop token ids back until then, and stop strings are not matched)."""
        min_tokens = self.request.params.min_tokens
        for i, tok in enumerate(new):
            stops = len(self.tokens) + i + 1 >= min_tokens
            if stops and tok in self._stop_ids:  # kept as a token, never as text (vLLM's rule)
                self.finish, self.stop_reason = Finish.STOP, tok
                return i + 1
            if self._decoder is None:
                continue
            if self._push_text(self._decoder.push(tok), match=stops):
                return i + 1
        return len(new)

    def _push_text(self, piece: str, match: bool = True) -> bool:
        """Append decoded text; True (and the text cut, the finish set) if it completes a stop
        (never when ``match`` is False)."""
        before = len(self.text)
        self.text += piece
        if not match:
            return False
        hit = None  # (start, stop): the earliest match that ends in the new text
        for s in self.request.stop:
            at = self.text.find(s, max(0, before - len(s) + 1))
            if at >= 0 and (hit is None or at < hit[0]):
                hit = (at, s)
        if hit is None:
            return False
        self.text = self.text[: hit[0]]
        self.finish, self.stop_reason = Finish.STOP, hit[1]
        return True

    def _take_text(self) -> Optional[str]:
        """Text not yet reported; while running, a possible stop string's start is held back."""
        if self.text is None:
            return None
        if self.finish == Finish.NONE:
            end = max(self._text_sent, len(self.text) - self._holdback)
        else:
            if self.finish != Finish.STOP:
                self._push_text(self._decoder.flush())  # an unfinished character at the end, as U+FFFD
            end = len(self.text)
        out, self._text_sent = self.text[self._text_sent : end], end
        return out

    def apply(self, emit: Emit, new: list[int], now: float) -> Update:
        """Take one tick's emit; the update to report (cut at a stop)."""
        self.passes += emit.passes
        spec = emit.spec
        self.proposed += spec.proposed
        self.accepted += spec.accepted
        self.drafts += spec.drafts
        if spec.proposed:
            self.recent_accepted = ACCEPTANCE_DECAY * self.recent_accepted + spec.accepted
            self.recent_proposed = ACCEPTANCE_DECAY * self.recent_proposed + spec.proposed
        if self.may_draft and emit.passes:
            self.tokens_per_pass = 0.5 * self.tokens_per_pass + 0.5 * len(new) / emit.passes
            self.draft_rows_per_pass = 0.5 * self.draft_rows_per_pass + 0.5 * spec.proposed / emit.passes
            self.drafted_ticks += 1
        self.ticks_since_draft = 0 if self.may_draft else self.ticks_since_draft + 1
        keep = self._append(new)
        tokens = new[:keep]
        logprobs = emit.logprobs[:keep] if emit.logprobs is not None else None
        if emit.prompt_logprobs is not None and len(emit.prompt_logprobs):
            self.prompt_logprobs_parts.append(emit.prompt_logprobs)
        if self.finish == Finish.NONE and emit.finish != Finish.NONE:
            # a prompt-only request's lane is released once scored: it ran its length
            self.finish = Finish.LENGTH if self.request.prompt_only and emit.finish == Finish.ABORTED else emit.finish
            self.error = getattr(emit, "error", None)
        self.tokens += tokens
        if logprobs is not None:
            self.logprobs_parts.append(logprobs)
        if tokens and self.first_token_at is None:
            self.first_token_at = now
        if self.finish != Finish.NONE:
            self.finished_at = now
        return Update(self, tokens, self._take_text(), logprobs, self.finish != Finish.NONE)

    def output(self, update: Optional[Update] = None) -> RequestOutput:
        """The outward record (:class:`~sf_trt.outputs.RequestOutput`): the delta ``update``
        added, or with none, everything so far (cumulative)."""
        if update is None:
            tokens, text, logprobs, finish = list(self.tokens), self.text, self.logprobs, self.finish
            prompt_lp = self.prompt_logprobs
        else:
            tokens, text, logprobs = list(update.tokens), update.text, update.logprobs
            finish = self.finish if update.finished else Finish.NONE
            prompt_lp = self.take_prompt_logprobs()
        return RequestOutput(
            self.seq_id, tokens, text, logprobs, finish, self.stop_reason, self.error, self.prompt_len, len(self.tokens),
            self.proposed, self.accepted, self.drafts, self.passes, self.arrival, self.admitted_at, self.first_token_at,
            self.finished_at, prompt_lp, self.cached_len,
        )

    def end(self, finish: Finish, now: float, error: Optional[str] = None) -> Update:
        """Finish now (aborted, failed) with what was reported so far."""
        self.finish, self.error, self.finished_at = finish, error, now
        lp = None if self.request.logprobs is None else TokenLogprobs.concat([], self.request.logprobs)
        return Update(self, [], self._take_text(), lp, True)

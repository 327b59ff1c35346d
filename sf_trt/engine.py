"""The plan-tick engine's data: plans (pure data), events, token rings.

A *plan* is what one tick should do: admit lanes, prefill prompt chunks, decode
``n`` tokens per lane, release lanes. It is built with a fluent builder and holds
nothing but data; the Executor checks the whole plan against its lanes before
anything runs (:mod:`sf_trt.executor`). A tick answers with :class:`Events`: one
:class:`Emit` per lane the plan touched, whose tokens sit in that lane's
:class:`TokenRing` behind a :class:`TokenRef`.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Optional, Union

import numpy as np

from .abi import TOP_LOGPROBS_MAX, Finish, Sampling, SamplingParams, Status, StatusError

__all__ = [
    "TOP_LOGPROBS_MAX", "DEFAULT_SCOPE", "Admit", "Prefill", "Decode", "Release", "Op", "Plan",
    "TokenRef", "TokenRing", "SpecCounts", "TokenLogprobs", "Emit", "Events",
]


DEFAULT_SCOPE = ""
"""The draft scope of lanes that name none (``Admit.draft_scope``): requests of one local
user share a corpus (:mod:`sf_trt.drafting.suffix`)."""


# -- plans -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Admit:
    lane: int
    prompt: int
    strategy_slot: int = 0
    sampling: Sampling = Sampling.GPU_GREEDY
    params: SamplingParams = SamplingParams()
    rng_counter_base: int = 0
    logprobs: Optional[int] = None
    """Report each emitted token's logprob and its ``logprobs`` most likely
    alternatives (0..:data:`TOP_LOGPROBS_MAX`); None: no logprobs."""
    draft_scope: Optional[str] = DEFAULT_SCOPE
    """Whose earlier requests the lane may draft from, and whose corpus its text
    joins when released (a tenant: API key and user); ``None``: its own text only,
    nothing kept. Read by drafters that keep a corpus (suffix) and by the prefix
    cache (whose cached prefixes the lane may start from, and which it adds to);
    never by the model."""
    cached_len: int = 0
    """Start the lane from the first ``cached_len`` positions of its prompt as the
    prefix cache holds them (at most ``Executor.cached_prefix(prompt, draft_scope)``);
    its prefill then starts there. 0: prefill it all."""
    prompt_logprobs: Optional[int] = None
    """Report the logprob of each prompt token after the first, from the prefill's own
    rows, and its ``prompt_logprobs`` most likely alternatives (0..:data:`TOP_LOGPROBS_MAX`;
    needs a backend with verify rows); None: none. Each emit carries the prompt tokens
    its tick prefilled (:attr:`Emit.prompt_logprobs`)."""


@dataclasses.dataclass(frozen=True)
class Prefill:
    lane: int
    start: int
    length: int


@dataclasses.dataclass(frozen=True)
class Decode:
    lane: int
    n: int
    max_draft: Optional[int] = None
    """At most this many draft tokens per pass in this tick (0: no drafting; None:
    the lane's strategy decides). Changes how many passes the tick takes, never a token."""


@dataclasses.dataclass(frozen=True)
class Release:
    """End a lane now (``Finish.ABORTED`` unless it finished in this tick)."""

    lane: int


Op = Union[Admit, Prefill, Decode, Release]


class Plan:
    """A fluent builder of one tick's ops; each method returns the builder."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def admit(
        self,
        lane: int,
        prompt: int,
        *,
        strategy_slot: int = 0,
        sampling: Sampling = Sampling.GPU_GREEDY,
        params: SamplingParams = SamplingParams(),
        rng_counter_base: int = 0,
        logprobs: Optional[int] = None,
        draft_scope: Optional[str] = DEFAULT_SCOPE,
        cached_len: int = 0,
        prompt_logprobs: Optional[int] = None,
    ) -> "Plan":
        self.ops.append(
            Admit(lane, prompt, strategy_slot, sampling, params, rng_counter_base, logprobs, draft_scope, cached_len, prompt_logprobs)
        )
        return self

    def prefill(self, lane: int, start: int, length: int) -> "Plan":
        self.ops.append(Prefill(lane, start, length))
        return self

    def decode(self, lane: int, n: int, *, max_draft: Optional[int] = None) -> "Plan":
        self.ops.append(Decode(lane, n, max_draft))
        return self

    def release(self, lane: int) -> "Plan":
        self.ops.append(Release(lane))
        return self

    def __repr__(self) -> str:
        return f"Plan({self.ops!r})"


# -- token rings -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TokenRef:
    """``length`` tokens of ring ``ring`` from absolute offset ``offset``."""

    ring: int
    offset: int
    length: int


class TokenRing:
    """A fixed-capacity ring of emitted tokens with wraparound.

    Offsets are absolute (they only grow), so a reference whose tokens have been
    overwritten is detected and refused instead of read as someone else's.
    """

    def __init__(self, ring_id: int, capacity: int) -> None:
        self.ring_id = ring_id
        self.capacity = capacity
        self._buf = np.zeros(capacity, np.int64)
        self.written = 0  # total tokens ever written

    def write(self, tokens: list[int]) -> TokenRef:
        n = len(tokens)
        if n > self.capacity:
            raise StatusError(Status.CAPACITY_EXHAUSTED, f"ring {self.ring_id}: {n} tokens exceed capacity {self.capacity}")
        start = self.written % self.capacity
        first = min(n, self.capacity - start)
        self._buf[start : start + first] = tokens[:first]
        self._buf[: n - first] = tokens[first:]
        ref = TokenRef(self.ring_id, self.written, n)
        self.written += n
        return ref

    def read(self, ref: TokenRef) -> list[int]:
        if ref.ring != self.ring_id:
            raise StatusError(Status.BAD_ARGUMENT, f"ring {self.ring_id}: reference is for ring {ref.ring}")
        if ref.offset < 0 or ref.length < 0 or ref.offset + ref.length > self.written:
            raise StatusError(
                Status.BAD_ARGUMENT, f"ring {self.ring_id}: {ref} reaches past the {self.written} tokens written"
            )
        if ref.offset < self.written - self.capacity:
            raise StatusError(
                Status.BAD_ARGUMENT,
                f"ring {self.ring_id}: {ref} was overwritten (the ring keeps the last {self.capacity} tokens)",
            )
        idx = (np.arange(ref.offset, ref.offset + ref.length) % self.capacity) if ref.length else np.zeros(0, np.int64)
        return self._buf[idx].tolist()


# -- events ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SpecCounts:
    """Draft tokens sent for verification, and those verified and emitted."""

    proposed: int = 0
    accepted: int = 0
    drafts: int = 0
    """Passes in which the lane sent a non-empty draft."""


@dataclasses.dataclass(frozen=True)
class TokenLogprobs:
    """Per emitted token: its logprob and the most likely alternatives at its position.

    ``logprob`` float32 ``[n]``; ``top_ids`` int64 ``[n, k]`` and ``top_logprobs``
    float32 ``[n, k]`` in descending order (``k`` as the lane's ``Admit.logprobs``).
    """

    logprob: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray

    def __len__(self) -> int:
        return int(self.logprob.shape[0])

    def __getitem__(self, index: slice) -> "TokenLogprobs":
        return TokenLogprobs(self.logprob[index], self.top_ids[index], self.top_logprobs[index])

    @staticmethod
    def concat(parts: list["TokenLogprobs"], k: int) -> "TokenLogprobs":
        if not parts:
            return TokenLogprobs(np.zeros(0, np.float32), np.zeros((0, k), np.int64), np.zeros((0, k), np.float32))
        return TokenLogprobs(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("logprob", "top_ids", "top_logprobs")))


@dataclasses.dataclass(frozen=True)
class Emit:
    """What one lane did in one tick."""

    lane: int
    token_ref: TokenRef
    finish: Finish
    spec: SpecCounts
    passes: int = 0
    """Decode passes (forward + verify) this lane took part in during the tick."""
    error: Optional[str] = None
    """What failed, when a backend primitive raised for this lane during the tick:
    ``"<op> (lanes 1, 4): <exception type>: <message>"``. ``finish`` is then
    ``Finish.ERROR``, except after a failed release, which ends no output (the lane
    keeps the finish it had; see :class:`~sf_trt.executor.Executor`)."""
    logprobs: Optional[TokenLogprobs] = None
    """For a lane admitted with ``logprobs``: one entry per token behind ``token_ref``."""
    prompt_logprobs: Optional[TokenLogprobs] = None
    """For a lane admitted with ``prompt_logprobs``: one entry per prompt token this tick's
    prefill scored, in order (prompt tokens 1, 2, ... over the ticks; token 0 has none)."""


class Events:
    """A tick's emits, one per lane the plan touched."""

    def __init__(self, emits: dict[int, Emit]) -> None:
        self._emits = emits

    def emit_for(self, lane: int) -> Emit:
        try:
            return self._emits[lane]
        except KeyError:
            raise KeyError(f"emit_for(lane={lane}): no emit in this tick (lanes: {sorted(self._emits)})") from None

    def __iter__(self) -> Iterator[Emit]:
        return iter(self._emits.values())

    def __len__(self) -> int:
        return len(self._emits)

    def __contains__(self, lane: int) -> bool:
        return lane in self._emits

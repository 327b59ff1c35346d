"""Requests to completion over the Executor: continuous batching, streaming.

:class:`Generator` runs a fixed list of whole requests (a prompt, sampling, a
token budget, stops) to their finish through :class:`~sf_trt.scheduler.Scheduler`,
the same scheduler the serving engine loop (:mod:`sf_trt.engine_loop`) runs for
requests that come and go: requests are admitted into free lane slots as others
finish, prompts are prefilled in chunks beside lanes that decode, each decoding
lane is asked for its tokens per tick (:class:`~sf_trt.scheduler.SchedulerConfig`,
the batch profile), and new tokens are reported after every tick. It is the layer the command line and the benchmarks share; it
holds no model logic.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from .abi import Finish
from .engine import TokenLogprobs
from .executor import Executor, ExecutorConfig
from .primitives import PrimitivesBase
from .scheduler import Request, Scheduler, SchedulerConfig, choice_key, run_to_completion, strategy_id

__all__ = ["Generator", "Request", "Result", "choice_key", "STRATEGY_ID"]

STRATEGY_ID = strategy_id("prompt_lookup")


@dataclasses.dataclass
class Result:
    """What a request produced. ``finish`` is ``Finish.ERROR`` when the backend
    failed for it; ``error`` then says which op and why (``tokens`` holds every
    token drawn before). ``error`` may also report a failed release after a normal
    finish, which cut nothing."""

    tokens: list[int]
    finish: Finish
    prompt_tokens: int
    seconds: float
    proposed: int = 0
    accepted: int = 0
    passes: int = 0
    drafts: int = 0
    text: Optional[str] = None
    """The decoded output (special tokens skipped, cut at a stop string); None without a tokenizer."""
    stop_reason: Optional[str | int] = None
    """The stop string or stop token id that ended the output (``finish == Finish.STOP``)."""
    logprobs: Optional[TokenLogprobs] = None
    error: Optional[str] = None
    """Why the request failed (a backend fault), when it did."""
    first_token_s: Optional[float] = None
    """Seconds from admission to the end of the tick that emitted the first token (the
    prefill and that tick: a tick's tokens arrive together); None when no token came."""

    @property
    def tokens_per_s(self) -> float:
        """Tokens over the seconds from admission to the finish (prefill included)."""
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


OnTokens = Callable[[int, list[int]], None]


class Generator:
    """Runs requests through one Executor, ``max_lanes`` of them at a time.

    ``config`` says how the scheduler runs (default: ``SchedulerConfig()``, the batch
    profile); keyword ``overrides`` replace its fields (``tick_tokens=4``,
    ``policy=DraftPolicy()``, ...). The policy sets how long each lane's drafts may be
    each tick (default :class:`~sf_trt.scheduler.LoadAwareDrafting`: drafts while
    they pay, none in a full batch); no policy changes a token."""

    def __init__(
        self,
        primitives: PrimitivesBase,
        config: Optional[SchedulerConfig] = None,
        *,
        executor_config: ExecutorConfig = ExecutorConfig(),
        tokenizer: Any = None,
        **overrides: Any,
    ) -> None:
        config = config if config is not None else SchedulerConfig()
        if overrides:
            config = dataclasses.replace(config, **overrides)
        self.primitives = primitives
        self.executor = Executor(primitives, executor_config)
        self.scheduler = Scheduler(self.executor, config, tokenizer=tokenizer)

    def run(self, requests: Sequence[Request], on_tokens: Optional[OnTokens] = None) -> list[Result]:
        """Run every request to its finish; results in request order.

        ``on_tokens(i, new_tokens)`` is called after each tick for request ``i``
        when it emitted tokens. Bad requests are refused (StatusError) before any
        runs: every request is checked and its prompt registered up front.
        """
        sched = self.scheduler
        seqs = []
        try:
            sched.retry_quarantined()  # a slot a failed release held may be free again
            for i, r in enumerate(requests):
                seqs.append(sched.add(r, seq_id=i, name=f"request {i}"))

            def on_update(u) -> None:
                if u.tokens and on_tokens is not None:
                    on_tokens(u.seq.seq_id, u.tokens)

            run_to_completion(sched, on_update)
        finally:
            sched.abort_all()  # interrupted: free the lanes and prompts so the generator stays usable
        return [
            Result(
                s.tokens, s.finish, s.prompt_len, (s.finished_at or 0.0) - (s.admitted_at or 0.0), s.proposed, s.accepted,
                s.passes, s.drafts, s.text, s.stop_reason, s.logprobs, s.error,
                None if s.first_token_at is None else s.first_token_at - (s.admitted_at or 0.0),
            )
            for s in seqs
        ]

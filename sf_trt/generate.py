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
from typing import Any, Callable, Iterator, Optional, Sequence

from .executor import Executor, ExecutorConfig
from .outputs import RequestOutput
from .primitives import PrimitivesBase
from .scheduler import Request, Scheduler, SchedulerConfig, choice_key

__all__ = ["Generator", "Request", "Result", "choice_key"]


Result = RequestOutput
"""What :meth:`Generator.run` returns per request: the one outward record, cumulative."""


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
        """Run every request to its finish; results (cumulative) in request order.

        ``on_tokens(i, new_tokens)`` is called after each tick for request ``i``
        when it emitted tokens. Bad requests are refused (StatusError) before any
        runs: every request is checked and its prompt registered up front.
        """
        seqs = self._add(requests)
        try:
            for update in self._steps():
                if update.tokens and on_tokens is not None:
                    on_tokens(update.seq.seq_id, update.tokens)
        finally:
            self.scheduler.abort_all()  # interrupted: free the lanes and prompts so the generator stays usable
        return [s.output() for s in seqs]

    def stream(self, requests: Sequence[Request]) -> Iterator[RequestOutput]:
        """Run every request to its finish, yielding deltas as they come (``index``: the
        request's position); each request's last delta has its finish.

        The requests are checked and queued now, so a bad one is refused (StatusError)
        before this returns and before any runs. Closing the iterator early (``break``,
        ``close()``) aborts what still runs; so does the next :meth:`run` or
        :meth:`stream` on this Generator if the iterator was left unfinished."""
        self._add(requests)

        def deltas() -> Iterator[RequestOutput]:
            try:
                for update in self._steps():
                    yield update.seq.output(update)
            finally:
                self.scheduler.abort_all()

        return deltas()

    def _add(self, requests: Sequence[Request]) -> list:
        """Queue every request (sequence ``i`` for request ``i``), refusing the whole batch
        before any runs when one is bad."""
        sched = self.scheduler
        sched.abort_all()  # a stream left unfinished: its requests end here
        try:
            sched.retry_quarantined()  # a slot a failed release held may be free again
            return [sched.add(r, seq_id=i, name=f"request {i}") for i, r in enumerate(requests)]
        except BaseException:
            sched.abort_all()
            raise

    def _steps(self) -> Iterator:
        """The scheduler's updates, step by step, until nothing waits or runs."""
        while self.scheduler.has_work:
            yield from self.scheduler.step()

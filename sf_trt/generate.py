"""Requests to completion over the Executor: continuous batching, streaming.

:class:`Generator` turns whole requests (a prompt, sampling, a token budget)
into plan ticks: it admits requests into free lane slots as others finish,
prefills prompts in chunks beside lanes that decode, asks each decoding lane for
``tick_tokens`` tokens per tick, and reports new tokens after every tick. It is
the layer the command line and the benchmarks share; it holds no model logic.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional, Sequence

from .abi import Finish, Sampling, SamplingParams, Status, StatusError
from .drafting import PromptLookupConfig
from .engine import Plan
from .executor import Executor, ExecutorConfig
from .primitives import PrimitivesBase

STRATEGY_ID = b"sf_trt.prompt_lookup.v1".ljust(32, b"\0")
DEFAULT_TICK_TOKENS = 16
"""Tokens each decoding lane is asked for per tick."""
DEFAULT_PREFILL_CHUNK = 256
"""Prompt tokens a lane prefills per tick."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation: ``prompt_ids`` continued under ``sampling``/``params``.

    ``params.max_tokens`` bounds the output (0: until EOS or the context).
    ``seed`` is the lane's RNG counter base. ``speculate`` turns prompt lookup on.
    """

    prompt_ids: Sequence[int]
    sampling: Sampling = Sampling.GPU_GREEDY
    params: SamplingParams = SamplingParams()
    seed: int = 0
    speculate: bool = True


@dataclasses.dataclass
class Result:
    tokens: list[int]
    finish: Finish
    prompt_tokens: int
    seconds: float
    proposed: int = 0
    accepted: int = 0
    passes: int = 0

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


OnTokens = Callable[[int, list[int]], None]


class Generator:
    """Runs requests through one Executor, ``max_lanes`` of them at a time."""

    def __init__(
        self,
        primitives: PrimitivesBase,
        *,
        draft_config: Optional[PromptLookupConfig] = None,
        tick_tokens: int = DEFAULT_TICK_TOKENS,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        executor_config: ExecutorConfig = ExecutorConfig(),
    ) -> None:
        if tick_tokens < 1 or prefill_chunk < 1:
            raise StatusError(Status.BAD_ARGUMENT, f"Generator: tick_tokens and prefill_chunk must be >= 1 (got {tick_tokens}, {prefill_chunk})")
        self.primitives = primitives
        self.executor = Executor(primitives, executor_config)
        self.tick_tokens = tick_tokens
        self.prefill_chunk = prefill_chunk
        caps = primitives.capabilities
        self.speculation_slot = 0
        if caps.verify_rows and caps.truncate_partial:
            self.speculation_slot, _ = self.executor.register_strategy("prompt_lookup", STRATEGY_ID, bytes(32), 0, draft_config)

    def run(self, requests: Sequence[Request], on_tokens: Optional[OnTokens] = None) -> list[Result]:
        """Run every request to its finish; results in request order.

        ``on_tokens(i, new_tokens)`` is called after each tick for request ``i``
        when it emitted tokens. Bad requests are refused (StatusError) before any
        runs: prompts are registered, and so checked, up front.
        """
        ex = self.executor
        if any(r.speculate for r in requests) and not self.speculation_slot:
            raise StatusError(Status.REJECT_ILLEGAL_COMBINATION, "generate: this backend cannot speculate (no verify rows or partial rollback)")
        prompt_ids: list[int] = []
        results: list[Optional[Result]] = [None] * len(requests)
        pending = list(range(len(requests)))
        live: dict[int, dict] = {}  # lane id (= request index) -> progress
        max_lanes = self.primitives.capabilities.max_lanes
        try:
            for r in requests:
                prompt_ids.append(ex.register_prompt(list(r.prompt_ids)))
            while pending or live:
                plan = Plan()
                while pending and len(live) < max_lanes:
                    i = pending.pop(0)
                    r = requests[i]
                    plan.admit(i, prompt_ids[i], strategy_slot=self.speculation_slot if r.speculate else 0,
                               sampling=r.sampling, params=r.params, rng_counter_base=r.seed)
                    live[i] = {"prefilled": 0, "t0": time.perf_counter()}
                    results[i] = Result([], Finish.NONE, len(r.prompt_ids), 0.0)
                for i, state in live.items():
                    n_prompt = len(requests[i].prompt_ids)
                    if state["prefilled"] < n_prompt:
                        n = min(self.prefill_chunk, n_prompt - state["prefilled"])
                        plan.prefill(i, state["prefilled"], n)
                        state["prefilled"] += n
                    if state["prefilled"] == n_prompt:
                        plan.decode(i, self.tick_tokens)
                events = ex.tick(plan)
                for e in events:
                    res = results[e.lane]
                    new = ex.read_tokens(e.token_ref)
                    res.tokens.extend(new)
                    res.proposed += e.spec.proposed
                    res.accepted += e.spec.accepted
                    res.passes += e.passes
                    if new and on_tokens is not None:
                        on_tokens(e.lane, new)
                    if e.finish != Finish.NONE:
                        res.finish = e.finish
                        res.seconds = time.perf_counter() - live.pop(e.lane)["t0"]
        finally:
            for pid in prompt_ids:
                ex.drop_prompt(pid)
            if live:  # interrupted: free the lanes so the generator stays usable
                plan = Plan()
                for i in live:
                    plan.release(i)
                ex.tick(plan)
        return results  # type: ignore[return-value]

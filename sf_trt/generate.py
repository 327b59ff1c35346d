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
    error: Optional[str] = None

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
        for name, value in (("tick_tokens", tick_tokens), ("prefill_chunk", prefill_chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StatusError(Status.BAD_ARGUMENT, f"Generator: {name} must be an int >= 1 (got {value!r})")
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
        runs: every prompt is registered and every admission checked up front. A
        backend fault ends the requests it hits with ``Finish.ERROR`` and their
        ``error``; the others run on.
        """
        ex = self.executor
        if any(r.speculate for r in requests) and not self.speculation_slot:
            raise StatusError(Status.REJECT_ILLEGAL_COMBINATION, "generate: this backend cannot speculate (no verify rows or partial rollback)")
        prompt_ids: list[int] = []
        results: list[Optional[Result]] = [None] * len(requests)
        pending = list(range(len(requests)))
        live: dict[int, dict] = {}  # lane id (= request index) -> progress, once admitted
        admitted: dict[int, dict] = {}  # the lanes the current tick admits
        try:
            for r in requests:
                prompt_ids.append(ex.register_prompt(list(r.prompt_ids)))
            self._retry_quarantined()
            for i in pending:
                ex.check(self._admit(Plan(), i, requests[i], prompt_ids[i]))
            while pending or live:
                plan = Plan()
                admitted = {}
                if pending and not live:
                    self._retry_quarantined()
                room = self.primitives.capabilities.max_lanes - len(ex.quarantined) - len(live)
                if pending and not live and room == 0:  # no slot left to run them in: they end here
                    why = f"generate: every lane slot is quarantined after a failed release ({'; '.join(ex.quarantined.values())})"
                    for i in pending:
                        results[i] = Result([], Finish.ERROR, len(requests[i].prompt_ids), 0.0, error=why)
                    break
                while pending and len(admitted) < room:
                    i = pending.pop(0)
                    self._admit(plan, i, requests[i], prompt_ids[i])
                    admitted[i] = {"prefilled": 0, "t0": time.perf_counter()}
                    results[i] = Result([], Finish.NONE, len(requests[i].prompt_ids), 0.0)
                for i, state in {**live, **admitted}.items():
                    n_prompt = len(requests[i].prompt_ids)
                    if state["prefilled"] < n_prompt:
                        n = min(self.prefill_chunk, n_prompt - state["prefilled"])
                        plan.prefill(i, state["prefilled"], n)
                        state["prefilled"] += n
                    if state["prefilled"] == n_prompt:
                        plan.decode(i, self.tick_tokens)
                events = ex.tick(plan)
                live.update(admitted)
                for e in events:
                    res = results[e.lane]
                    new = ex.read_tokens(e.token_ref)
                    res.tokens.extend(new)
                    res.proposed += e.spec.proposed
                    res.accepted += e.spec.accepted
                    res.passes += e.passes
                    if new and on_tokens is not None:
                        on_tokens(e.lane, new)
                    res.error = e.error or res.error
                    if e.finish != Finish.NONE:
                        res.finish = e.finish
                        res.seconds = time.perf_counter() - live.pop(e.lane)["t0"]
        finally:
            for pid in prompt_ids:
                ex.drop_prompt(pid)
            stranded = [i for i in {**live, **admitted} if i in ex.lanes]
            if stranded:  # interrupted: free the lanes it admitted, so the generator stays usable
                plan = Plan()
                for i in stranded:
                    plan.release(i)
                ex.tick(plan)
        return results  # type: ignore[return-value]

    def _retry_quarantined(self) -> None:
        """Release the quarantined slots again (every tick does; an empty one will)."""
        if self.executor.quarantined:
            self.executor.tick(Plan())

    def _admit(self, plan: Plan, i: int, r: Request, prompt_id: int) -> Plan:
        return plan.admit(i, prompt_id, strategy_slot=self.speculation_slot if r.speculate else 0,
                          sampling=r.sampling, params=r.params, rng_counter_base=r.seed)

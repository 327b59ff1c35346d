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
from typing import Any, Callable, Optional, Sequence, Union

from .abi import Finish, Sampling, SamplingParams, Status, StatusError
from .drafting import DEFAULT_SCOPE
from .engine import Plan
from .executor import Executor, ExecutorConfig
from .primitives import PrimitivesBase
from .strategies import KINDS



def strategy_id(kind: str) -> bytes:
    """The 32-byte id the generator registers a drafter kind under."""
    return f"sf_trt.{kind}.v1".encode().ljust(32, b"\0")


STRATEGY_ID = strategy_id("prompt_lookup")
DEFAULT_TICK_TOKENS = 16
"""Tokens each decoding lane is asked for per tick."""
DEFAULT_PREFILL_CHUNK = 256
"""Prompt tokens a lane prefills per tick."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation: ``prompt_ids`` continued under ``sampling``/``params``.

    ``params.max_tokens`` bounds the output (0: until EOS or the context).
    ``seed`` is the lane's RNG counter base. ``speculate``: a drafter kind
    (``"prompt_lookup"``, ``"suffix"``), ``"none"`` or False for none, True for the
    generator's default kind. ``draft_scope``: whose finished requests the suffix
    drafter may draft from and whose corpus this one joins (see
    :mod:`sf_trt.drafting.suffix`); None keeps it private.
    """

    prompt_ids: Sequence[int]
    sampling: Sampling = Sampling.GPU_GREEDY
    params: SamplingParams = SamplingParams()
    seed: int = 0
    speculate: Union[bool, str] = True
    draft_scope: Optional[str] = DEFAULT_SCOPE


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
    """Runs requests through one Executor, ``max_lanes`` of them at a time.

    Every drafter kind is registered once (``draft_config``: one kind's config,
    or several, each kind's default otherwise), so requests choose theirs;
    ``speculate`` is the kind of requests that say ``speculate=True``. The suffix
    drafter's corpus lives in the executor's grant: it outlives ``run`` calls.
    """

    def __init__(
        self,
        primitives: PrimitivesBase,
        *,
        draft_config: Union[Any, Sequence[Any], None] = None,
        speculate: str = "prompt_lookup",
        tick_tokens: int = DEFAULT_TICK_TOKENS,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        executor_config: ExecutorConfig = ExecutorConfig(),
    ) -> None:
        for name, value in (("tick_tokens", tick_tokens), ("prefill_chunk", prefill_chunk)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StatusError(Status.BAD_ARGUMENT, f"Generator: {name} must be an int >= 1 (got {value!r})")
        if speculate not in KINDS:
            raise StatusError(Status.BAD_ARGUMENT, f"Generator: speculate={speculate!r} is not a drafter kind (kinds: {sorted(KINDS)})")
        configs = list(draft_config) if isinstance(draft_config, (list, tuple)) else [draft_config] if draft_config is not None else []
        for config in configs:
            if not any(isinstance(config, kind.config_type) for kind in KINDS.values()):
                raise StatusError(Status.BAD_ARGUMENT, f"Generator: draft_config {type(config).__name__} is no drafter kind's config")
        self.primitives = primitives
        self.executor = Executor(primitives, executor_config)
        self.tick_tokens = tick_tokens
        self.prefill_chunk = prefill_chunk
        self.default_kind = speculate
        self.slots: dict[str, int] = {}
        """Each drafter kind's strategy slot (empty when the backend cannot speculate)."""
        caps = primitives.capabilities
        if caps.verify_rows and caps.truncate_partial:
            for name, kind in KINDS.items():
                config = next((c for c in configs if isinstance(c, kind.config_type)), None)
                self.slots[name], _ = self.executor.register_strategy(name, strategy_id(name), bytes(32), 0, config)

    @property
    def speculation_slot(self) -> int:
        """The default kind's slot (0: the backend cannot speculate)."""
        return self.slots.get(self.default_kind, 0)

    def _slot(self, i: int, r: Request) -> int:
        """The strategy slot request ``i`` asks for (0: none); refused if unknown or impossible."""
        kind = r.speculate
        if kind is False or kind == "none":
            return 0
        if kind is True:
            kind = self.default_kind
        if not isinstance(kind, str) or kind not in KINDS:
            raise StatusError(Status.BAD_ARGUMENT, f"request {i}: speculate={r.speculate!r} names no drafter (expected True, False, 'none' or one of {sorted(KINDS)})")
        if not self.slots:
            raise StatusError(Status.REJECT_ILLEGAL_COMBINATION, "generate: this backend cannot speculate (no verify rows or partial rollback)")
        return self.slots[kind]

    def run(self, requests: Sequence[Request], on_tokens: Optional[OnTokens] = None) -> list[Result]:
        """Run every request to its finish; results in request order.

        ``on_tokens(i, new_tokens)`` is called after each tick for request ``i``
        when it emitted tokens. Bad requests are refused (StatusError) before any
        runs: every prompt is registered and every admission checked up front. A
        backend fault ends the requests it hits with ``Finish.ERROR`` and their
        ``error``; the others run on.
        """
        ex = self.executor
        slots = [self._slot(i, r) for i, r in enumerate(requests)]
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
        return plan.admit(i, prompt_id, strategy_slot=self._slot(i, r), sampling=r.sampling, params=r.params,
                          rng_counter_base=r.seed, draft_scope=r.draft_scope)

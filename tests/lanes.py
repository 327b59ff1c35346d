"""Shared test helpers: run many lanes through one executor on a schedule."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Union

from sf_trt.abi import Finish, Sampling, SamplingParams
from sf_trt.drafting import DEFAULT_SCOPE, SuffixConfig
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.primitives import PrimitivesBase
from sf_trt.testing import Harness, register_drafter_with

ID = bytes([1]) * 32
DIGEST = bytes([2]) * 32


@dataclasses.dataclass(frozen=True)
class LaneSpec:
    prompt: tuple[int, ...]
    mode: Sampling = Sampling.GPU_GREEDY
    params: SamplingParams = SamplingParams()
    speculate: Union[bool, str] = False
    """A drafter kind, or True for the run's default kind."""
    seed: int = 0
    admit_tick: int = 0
    prefill_chunk: int = 1 << 30
    budgets: tuple[int, ...] = (16,)
    """Tokens asked for in each decode tick, in order."""
    scope: Optional[str] = DEFAULT_SCOPE


@dataclasses.dataclass
class LaneRun:
    tokens: list[int]
    finish: Finish
    proposed: int = 0
    accepted: int = 0
    passes: int = 0
    error: Optional[str] = None


def kind_of(config: Any) -> str:
    return "suffix" if isinstance(config, SuffixConfig) else "prompt_lookup"


def run_lanes(
    make_primitives: Callable[[], PrimitivesBase],
    specs: list[LaneSpec],
    draft_config: Any = None,
    *,
    harness: Optional[Harness] = None,
    executor_config: ExecutorConfig = ExecutorConfig(),
    before_tick: Optional[Callable[[int, Harness], None]] = None,
    cached: Optional[dict[int, int]] = None,
) -> list[LaneRun]:
    """Run every lane through one executor, ticks interleaved; each lane's result.

    A lane (its id: its index in ``specs``) is admitted at its ``admit_tick``,
    prefilled a chunk per tick, then asks for ``budgets[i]`` tokens in its i-th
    decode tick until the budgets are used up or it finishes (a backend fault
    included). After every tick the harness checks the invariants, and every live
    lane's tokens must all have been delivered in its emits.
    ``before_tick(tick, harness)`` is called before each tick that runs a plan.
    ``draft_config`` picks the default drafter kind (prompt lookup when None);
    ``harness``: run on an existing one (its suffix corpora carry over).
    ``cached``: when given, each lane starts from the longest prefix the executor's
    prefix cache holds for it at its admission (and its prefill from there); the
    positions taken are recorded in it by lane.
    """
    h = harness or Harness.with_engine(Executor(make_primitives(), executor_config))
    default = kind_of(draft_config)
    slots = {False: 0}
    for s in specs:
        kind = default if s.speculate is True else s.speculate
        if kind and kind not in slots:
            slots[kind], _ = register_drafter_with(h, kind, ID, DIGEST, 0, draft_config if kind == default else None)
    prompts = [h.prompt(list(s.prompt)) for s in specs]
    runs = [LaneRun([], Finish.NONE) for _ in specs]
    prefilled = [0] * len(specs)
    decodes = [0] * len(specs)
    done = [False] * len(specs)
    tick = 0
    while not all(done):
        plan = h.plan()
        touched = []
        for i, s in enumerate(specs):
            if done[i] or tick < s.admit_tick:
                continue
            if tick == s.admit_tick:
                kind = default if s.speculate is True else s.speculate
                if cached is not None:
                    cached[i] = prefilled[i] = h.engine.cached_prefix(prompts[i], s.scope)
                plan.admit(i, prompts[i], strategy_slot=slots[kind], sampling=s.mode, params=s.params, rng_counter_base=s.seed,
                           draft_scope=s.scope, cached_len=prefilled[i])
            if prefilled[i] < len(s.prompt):
                n = min(s.prefill_chunk, len(s.prompt) - prefilled[i])
                plan.prefill(i, prefilled[i], n)
                prefilled[i] += n
            if prefilled[i] == len(s.prompt) and decodes[i] < len(s.budgets):
                plan.decode(i, s.budgets[decodes[i]])
                decodes[i] += 1
            touched.append(i)
        if plan.ops:
            if before_tick is not None:
                before_tick(tick, h)
            ev = h.tick_ok(plan)
            for i in touched:
                e = ev.emit_for(i)
                got = h.rings_tokens(e.token_ref)
                runs[i].tokens.extend(got)
                runs[i].finish = e.finish
                runs[i].proposed += e.spec.proposed
                runs[i].accepted += e.spec.accepted
                runs[i].passes += e.passes
                runs[i].error = e.error or runs[i].error
                if e.finish == Finish.NONE:
                    assert h.engine.lane_tokens(i)[len(specs[i].prompt):] == runs[i].tokens, f"lane {i}: a token drawn was not delivered"
                if e.finish != Finish.NONE or decodes[i] == len(specs[i].budgets):
                    if e.finish == Finish.NONE:
                        h.tick_ok(h.plan().release(i))
                    done[i] = True
        tick += 1
        if tick > 10_000:
            raise AssertionError("schedule did not finish")
    return runs


def plain_alone(make_primitives: Callable[[], PrimitivesBase], spec: LaneSpec) -> LaneRun:
    """The lane alone, without a strategy, its whole budget in one decode."""
    solo = dataclasses.replace(spec, speculate=False, admit_tick=0, prefill_chunk=1 << 30, budgets=(sum(spec.budgets),))
    return run_lanes(make_primitives, [solo])[0]

"""The executor survives backend faults: a fault at every primitive call site.

Each test runs three lanes through the real fake wrapped in
:class:`~sf_trt.faults.FaultyPrimitives`, with a fault injected at one call, and
the same schedule without faults as the control. The lanes of the failed pass end
with ``Finish.ERROR`` and an error naming the op; what they emitted is the
control's output up to the fault, with every token drawn before it; every other
lane emits exactly what it emits in the control run, token for token; the
harness checks the executor's invariants after every tick (``run_lanes`` also
checks that every token a live lane holds was delivered).

Lanes (ids 0, 1, 2): 0 and 1 decode side by side from tick 1; lane 2 is admitted
at tick 2 and prefills 3 tokens a tick, so it is still prefilling there.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import pytest

from sf_trt.abi import Finish, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.faults import Fault, FaultyPrimitives
from sf_trt.testing import Harness, register_prompt_lookup_with

from lanes import DIGEST, ID, LaneSpec, run_lanes

CFG = FakeConfig(
    vocab=24, eos=23, copy_model=True, copy_miss_every=3, verify_rows=True,
    max_lanes=4, max_context=160, max_rows_per_pass=64, top_k_limit=16,
)
PREFILL_ROWS = ExecutorConfig(max_prefill_rows=4)
MODES = [(Sampling.GPU_GREEDY, False), (Sampling.GPU_GREEDY, True), (Sampling.GPU_GUMBEL, False), (Sampling.GPU_GUMBEL, True)]
MODE_IDS = ["greedy", "greedy-spec", "sampled", "sampled-spec"]


def specs(mode: Sampling, speculate: bool, max_tokens: int = 0) -> list[LaneSpec]:
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=max_tokens, flags=SamplingFlag.IGNORE_EOS)
    lane = functools.partial(LaneSpec, mode=mode, params=params, speculate=speculate)
    return [
        lane(prompt=(1, 2, 3, 4, 5, 6, 7, 1, 2, 3), seed=11, prefill_chunk=6, budgets=(6,) * 5),
        lane(prompt=(2, 4, 6, 8, 2, 4, 6), seed=12, prefill_chunk=3, budgets=(5,) * 5),
        lane(prompt=(3, 5, 7, 3, 5, 7, 3), seed=13, admit_tick=2, prefill_chunk=3, budgets=(7,) * 4),
    ]


@dataclasses.dataclass
class Run:
    lanes: list  # LaneRun per lane id
    prims: FaultyPrimitives
    calls: dict[int, dict[str, int]]  # tick -> primitive calls made before it
    held: dict[int, dict[int, int]]  # tick -> {lane: tokens it held before the tick}
    quarantined: dict[int, dict[int, str]]  # tick -> the executor's quarantine before it


def run(lane_specs: list[LaneSpec], faults=(), backend=functools.partial(FakePrimitives, CFG)) -> Run:
    box: dict = {}

    def make():
        box["p"] = FaultyPrimitives(backend(), faults)
        return box["p"]

    r = Run([], None, {}, {}, {})  # type: ignore[arg-type]

    def before(tick: int, h: Harness) -> None:
        r.calls[tick] = dict(box["p"].calls)
        r.held[tick] = {lane: len(h.engine.lane_tokens(lane)) - len(lane_specs[lane].prompt) for lane in h.engine.lanes}
        r.quarantined[tick] = h.engine.quarantined

    r.lanes = run_lanes(make, lane_specs, executor_config=PREFILL_ROWS, before_tick=before)
    r.prims = box["p"]
    return r


def check_against_control(faulty: Run, control: Run, failed: set[int], op: str) -> None:
    """``failed`` ended with ERROR naming ``op``, emitting the control's output up to the
    fault; every other lane emitted exactly the control's output."""
    assert faulty.prims.fired, "the fault never fired"
    assert {i for i, r in enumerate(faulty.lanes) if r.finish == Finish.ERROR} == failed
    for i, (got, want) in enumerate(zip(faulty.lanes, control.lanes)):
        if i in failed:
            assert got.error.startswith(f"{op} (lane"), got.error
            assert "InjectedFault" in got.error or "logits" in got.error, got.error
            assert got.tokens == want.tokens[: len(got.tokens)], f"lane {i}: tokens before the fault differ from the control"
        else:
            assert (got.tokens, got.finish, got.error) == (want.tokens, want.finish, None), f"bystander lane {i} changed"


def at(control: Run, op: str, tick: int, nth: int) -> int:
    """The call number of the ``nth`` call of ``op`` in ``tick`` (from the control run)."""
    return control.calls[tick][op] + nth


# -- the call sites ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["raise", "raise_after"])
@pytest.mark.parametrize("mode, speculate", MODES, ids=MODE_IDS)
def test_a_prefill_fault_ends_the_lanes_of_that_pass_and_drops_their_later_rows(mode, speculate, kind):
    # Tick 0 prefills lane 0's rows 0..5 and lane 1's rows 0..2, 4 rows a pass:
    # pass 1 = lane 0 x4, pass 2 = lane 0 x2 + lane 1 x2, pass 3 = lane 1 x1.
    control = run(specs(mode, speculate))
    assert control.prims.calls["prefill"] >= 3
    first = run(specs(mode, speculate), [Fault("prefill", 1, kind)])
    check_against_control(first, control, {0}, "prefill forward")
    assert first.prims.calls["prefill"] < control.prims.calls["prefill"], "lane 0's later prefill rows were dropped"
    second = run(specs(mode, speculate), [Fault("prefill", 2, kind)])
    check_against_control(second, control, {0, 1}, "prefill forward")


@pytest.mark.parametrize("kind", ["raise", "raise_after"])
@pytest.mark.parametrize("mode, speculate", MODES, ids=MODE_IDS)
def test_a_decode_forward_fault_ends_the_lanes_of_the_step_and_keeps_what_they_drew(mode, speculate, kind):
    control = run(specs(mode, speculate))
    faulty = run(specs(mode, speculate), [Fault("decode", at(control, "decode", 2, 2), kind)])
    check_against_control(faulty, control, {0, 1}, "decode forward")
    for lane in (0, 1):  # the first step of tick 2 drew at least one token: it was delivered
        assert len(faulty.lanes[lane].tokens) > faulty.held[2][lane]
    assert "lanes 0, 1" in faulty.lanes[0].error


@pytest.mark.parametrize("mode, speculate", MODES, ids=MODE_IDS)
def test_a_verify_sample_fault_ends_the_lanes_of_the_step_and_keeps_what_they_drew(mode, speculate):
    control = run(specs(mode, speculate))
    faulty = run(specs(mode, speculate), [Fault("verify_sample", at(control, "verify_sample", 2, 2))])
    check_against_control(faulty, control, {0, 1}, "verify_sample")
    for lane in (0, 1):
        assert len(faulty.lanes[lane].tokens) > faulty.held[2][lane]


@pytest.mark.parametrize("kind", ["raise", "raise_after"])
@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL], ids=["greedy", "sampled"])
def test_a_truncate_fault_ends_that_lane_alone_with_the_tokens_of_its_step(mode, kind):
    control = run(specs(mode, True))
    ticks = sorted(control.calls)
    tick = min(t for t, nxt in zip(ticks, ticks[1:]) if t >= 2 and control.calls[nxt]["truncate"] > control.calls[t]["truncate"])
    faulty = run(specs(mode, True), [Fault("truncate", at(control, "truncate", tick, 1), kind)])
    failed = {i for i, r in enumerate(faulty.lanes) if r.finish == Finish.ERROR}
    assert len(failed) == 1
    check_against_control(faulty, control, failed, "truncate")
    (lane,) = failed
    assert len(faulty.lanes[lane].tokens) > faulty.held[tick][lane], "the tokens of the truncated step were delivered"


@pytest.mark.parametrize("kind", ["raise", "raise_after"])
@pytest.mark.parametrize("mode, speculate", MODES, ids=MODE_IDS)
def test_a_release_fault_keeps_the_finish_and_quarantines_the_slot_until_a_release_succeeds(mode, speculate, kind):
    lane_specs = specs(mode, speculate, max_tokens=9)  # every lane ends with LENGTH, each release is its own
    control = run(lane_specs)
    faulty = run(lane_specs, [Fault("release", 1, kind)])
    assert faulty.prims.fired
    for got, want in zip(faulty.lanes, control.lanes):
        assert (got.tokens, got.finish) == (want.tokens, want.finish) == (want.tokens, Finish.LENGTH)
    (hit,) = [r for r in faulty.lanes if r.error]
    assert hit.error.startswith("release (lane ") and "InjectedFault" in hit.error
    quarantines = [q for q in faulty.quarantined.values() if q]
    assert quarantines, "the slot was quarantined for a tick"
    assert not list(faulty.quarantined.values())[-1], "then released again"


def test_a_failed_release_after_a_fault_reports_both():
    control = run(specs(Sampling.GPU_GREEDY, True))
    faulty = run(specs(Sampling.GPU_GREEDY, True), [Fault("decode", at(control, "decode", 2, 1)), Fault("release", 1)])
    check_against_control(faulty, control, {0, 1}, "decode forward")
    errors = sorted(r.error for r in faulty.lanes[:2])
    assert any("; then release (lane" in e for e in errors), errors


# -- logits the sampler cannot use -------------------------------------------------------


@pytest.mark.parametrize(
    "kind, words", [("nan", "hold NaN"), ("posinf", "hold +inf"), ("neginf", "are all -inf"), ("huge", "overflow float32")]
)
@pytest.mark.parametrize("speculate", [False, True], ids=["plain", "spec"])
def test_unusable_logits_end_only_the_lane_of_that_row(kind, words, speculate):
    """Row 0 of a decode step is lane 0's pending row; lane 1 shares the step and goes on."""
    mode = Sampling.GPU_GUMBEL  # 3e38 / 0.8 overflows; greedy does not divide
    control = run(specs(mode, speculate))
    faulty = run(specs(mode, speculate), [Fault("decode", at(control, "decode", 2, 1), kind, rows=(0,))])
    check_against_control(faulty, control, {0}, "verify_sample")
    assert words in faulty.lanes[0].error
    held = faulty.held[2][0]
    assert len(faulty.lanes[0].tokens) == held, "no token for the faulty row"
    assert f"position {len(specs(mode, speculate)[0].prompt) + held}" in faulty.lanes[0].error


def test_tokens_of_a_draft_before_an_unusable_row_are_emitted():
    """A text that repeats: drafts are taken whole. Poisoning row 3 of a step (the
    pending row, then drafts 1, 2, 3) emits the tokens drawn at rows 0..2."""
    backend = functools.partial(FakePrimitives, dataclasses.replace(CFG, copy_miss_every=0))
    prompt = (5, 6, 7, 8) * 5
    spec = LaneSpec(prompt, params=SamplingParams(flags=SamplingFlag.IGNORE_EOS), speculate=True, budgets=(12,) * 4)
    control = run([spec], backend=backend)
    faulty = run([spec], [Fault("decode", at(control, "decode", 2, 1), "nan", rows=(3,))], backend=backend)
    held = faulty.held[2][0]
    got = faulty.lanes[0]
    assert got.finish == Finish.ERROR and "hold NaN" in got.error
    assert got.tokens == control.lanes[0].tokens[: held + 3]


def test_greedy_rows_may_hold_huge_finite_logits():
    control = run(specs(Sampling.GPU_GREEDY, False))
    faulty = run(specs(Sampling.GPU_GREEDY, False), [Fault("decode", at(control, "decode", 2, 1), "huge", rows=(0,))])
    assert all(r.finish != Finish.ERROR for r in faulty.lanes), "a finite logit is the backend's answer under greedy"


# -- after a fault -------------------------------------------------------------------------


def harness(faults=(), max_lanes: int = 4) -> tuple[Harness, FaultyPrimitives, int]:
    prims = FaultyPrimitives(FakePrimitives(dataclasses.replace(CFG, max_lanes=max_lanes)), faults)
    h = Harness.with_engine(Executor(prims, ExecutorConfig()))
    slot, _ = register_prompt_lookup_with(h, ID, DIGEST, 0)
    return h, prims, slot


def test_the_failed_lanes_id_and_slot_serve_a_new_lane_exactly():
    h, prims, slot = harness([Fault("decode", 2)], max_lanes=1)
    p = h.prompt([1, 2, 3, 1, 2, 3])
    plan = lambda: h.plan().admit(4, p, strategy_slot=slot).prefill(4, 0, 6).decode(4, 20)  # noqa: E731
    e = h.tick_ok(plan()).emit_for(4)
    assert e.finish == Finish.ERROR and e.error.startswith("decode forward (lane 4): InjectedFault")
    before = h.rings_tokens(e.token_ref)
    again = h.tick_ok(plan()).emit_for(4)
    control, _, cslot = harness(max_lanes=1)
    cp = control.prompt([1, 2, 3, 1, 2, 3])
    want = control.rings_tokens(control.tick_ok(control.plan().admit(4, cp, strategy_slot=cslot).prefill(4, 0, 6).decode(4, 20)).emit_for(4).token_ref)
    assert (again.finish, again.error, h.rings_tokens(again.token_ref)) == (Finish.NONE, None, want)
    assert before == want[: len(before)] and before


def test_a_quarantined_slot_holds_capacity_until_its_release_succeeds():
    h, prims, _ = harness([Fault("release", n) for n in (1, 2, 3)], max_lanes=1)
    p = h.prompt([1, 2, 3])
    e = h.tick_ok(h.plan().admit(1, p, params=SamplingParams(max_tokens=2)).prefill(1, 0, 3).decode(1, 5)).emit_for(1)
    assert (e.finish, len(h.rings_tokens(e.token_ref))) == (Finish.LENGTH, 2)
    assert h.engine.quarantined == {0: e.error} and h.engine.lanes == []
    assert h.tick_err(h.plan().admit(2, p)) == Status.CAPACITY_EXHAUSTED
    assert "(1 quarantined after a failed release)" in str(h.last_error)
    h.tick_ok(h.plan())  # release #2 fails: still quarantined
    assert h.engine.quarantined
    h.tick_ok(h.plan())  # release #3 fails
    h.tick_ok(h.plan())  # release #4 succeeds
    assert h.engine.quarantined == {}
    e = h.tick_ok(h.plan().admit(2, p).prefill(2, 0, 3).decode(2, 2)).emit_for(2)
    assert e.finish == Finish.NONE and len(h.rings_tokens(e.token_ref)) == 2


def test_a_refused_plan_still_changes_nothing_while_a_slot_is_quarantined():
    h, _, _ = harness([Fault("release", 1), Fault("release", 2)], max_lanes=2)
    p = h.prompt([1, 2, 3])
    h.tick_ok(h.plan().admit(1, p).prefill(1, 0, 3).decode(1, 2).release(1))
    assert h.engine.quarantined
    assert h.tick_err(h.plan().decode(1, 1)) == Status.UNKNOWN_LANE  # snapshot unchanged, no release retried


REFUSALS = {
    "fault at an unknown op": lambda: Fault("forward", 1),
    "fault of an unknown kind": lambda: Fault("decode", 1, "segfault"),
    "fault poisoning logits a call does not return": lambda: Fault("prefill", 1, "nan"),
    "fault at call 0": lambda: Fault("decode", 0),
}
"""Fault descriptions refused, by the name docs/errors.md gives them."""


@pytest.mark.parametrize("case", list(REFUSALS))
def test_fault_descriptions_are_checked(case):
    with pytest.raises(StatusError) as err:
        REFUSALS[case]()
    assert err.value.status == Status.BAD_ARGUMENT and str(err.value).startswith("Fault: ")


def test_docs_errors_lists_the_ops_these_tests_fail():
    """The faults table of docs/errors.md names exactly the ops the executor reports."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    section = text.split("## Backend faults", 1)[1].split("\n## ", 1)[0]
    ops = {m.group(1) for m in re.finditer(r"^\| `([a-z_ ]+)`", section, re.M)}
    assert ops == {"prefill forward", "decode forward", "verify_sample", "truncate", "release"}


# -- the real decoder ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault, failed, op",
    [
        (lambda c: Fault("prefill", 1), {0}, "prefill forward"),
        (lambda c: Fault("decode", at(c, "decode", 2, 2), "raise_after"), {0, 1}, "decode forward"),
        (lambda c: Fault("verify_sample", at(c, "verify_sample", 2, 1)), {0, 1}, "verify_sample"),
        (lambda c: Fault("decode", at(c, "decode", 2, 1), "nan", rows=(0,)), {0}, "verify_sample"),
    ],
    ids=["prefill", "decode", "verify_sample", "nan-logits"],
)
def test_faults_on_the_onnxruntime_decoder(tiny_model_dir, fault, failed, op):
    """FaultyPrimitives wraps the real decoder as it wraps the fake: same contract."""
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives

    decoder = functools.partial(OrtDecoderPrimitives, tiny_model_dir, max_lanes=4, max_context=160, threads=1)
    control = run(specs(Sampling.GPU_GUMBEL, True), backend=decoder)
    check_against_control(run(specs(Sampling.GPU_GUMBEL, True), [fault(control)], backend=decoder), control, failed, op)

"""Prompt-lookup speculation in the executor: drafts verified in one pass change
nothing a plain decode would have produced.

The Python form of ``shared/seed/prompt_lookup_speculation.rs``: the same six
tests, under SPEC.md's names, their meaning unchanged.
"""

from __future__ import annotations

import dataclasses

import pytest

from sf_trt.abi import (
    CertMode,
    Exactness,
    Finish,
    Sampling,
    SamplingFlag,
    SamplingParams,
    Status,
    StatusError,
)
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.testing import Harness, register_prompt_lookup_with


def harness(cfg: FakeConfig) -> Harness:
    return Harness.with_engine(Executor(FakePrimitives(cfg), ExecutorConfig()))


def copying() -> FakeConfig:
    return dataclasses.replace(FakeConfig(), verify_rows=True, copy_model=True, vocab=512, eos=511)


@dataclasses.dataclass
class Run:
    tokens: list
    finish: Finish
    proposed: int
    accepted: int


def generate(cfg, speculate, params, mode, prompt, ticks, per_tick) -> Run:
    """`ticks` ticks of `per_tick` new tokens on one lane, speculating or not."""
    h = harness(cfg)
    slot = register_prompt_lookup_with(h, bytes([1]) * 32, bytes([2]) * 32, 0)[0] if speculate else 0
    p = h.prompt(prompt)
    run = Run([], Finish.NONE, 0, 0)
    ev = h.tick_ok(
        h.plan()
        .admit(1, p, strategy_slot=slot, sampling=mode, params=params, rng_counter_base=77)
        .prefill(1, 0, len(prompt))
        .decode(1, per_tick)
    )
    take(run, h, ev)
    for _ in range(1, ticks):
        if run.finish != Finish.NONE:
            break
        take(run, h, h.tick_ok(h.plan().decode(1, per_tick)))
    return run


def take(run: Run, h: Harness, ev) -> None:
    e = ev.emit_for(1)
    run.tokens.extend(h.rings_tokens(e.token_ref))
    run.finish = e.finish
    run.proposed += e.spec.proposed
    run.accepted += e.spec.accepted


def greedy() -> SamplingParams:
    return SamplingParams(flags=SamplingFlag.IGNORE_EOS)


def test_greedy_drafts_change_nothing_and_are_taken_when_the_text_repeats():
    prompt = [10, 11, 12, 13, 14, 15, 10, 11, 12]
    plain = generate(copying(), False, greedy(), Sampling.GPU_GREEDY, prompt, 4, 16)
    spec = generate(copying(), True, greedy(), Sampling.GPU_GREEDY, prompt, 4, 16)
    assert len(plain.tokens) == 64
    assert spec.tokens == plain.tokens, "a verified draft is the plain decode"
    assert plain.proposed == 0
    assert spec.proposed > 0 and spec.accepted > spec.proposed // 2, f"{spec.accepted} of {spec.proposed} drafts taken"


def test_sampled_drafts_draw_what_a_plain_decode_draws():
    params = SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)
    prompt = [20, 21, 22, 23, 20, 21, 22, 23, 20, 21]
    plain = generate(copying(), False, params, Sampling.GPU_GUMBEL, prompt, 3, 24)
    spec = generate(copying(), True, params, Sampling.GPU_GUMBEL, prompt, 3, 24)
    assert spec.tokens == plain.tokens, "each row is drawn at the position a plain decode draws it"
    assert spec.proposed > 0


def test_rejected_drafts_roll_back_cleanly():
    # A model that copies but misses every third position: drafts are taken
    # in part, and a rejected tail left in the state would change every row
    # after it.
    cfg = dataclasses.replace(copying(), copy_miss_every=3)
    prompt = [3, 4, 5, 3, 4, 5, 3, 4, 5, 3, 4]
    plain = generate(cfg, False, greedy(), Sampling.GPU_GREEDY, prompt, 4, 16)
    spec = generate(cfg, True, greedy(), Sampling.GPU_GREEDY, prompt, 4, 16)
    assert spec.tokens == plain.tokens
    assert 0 < spec.accepted < spec.proposed, f"taken in part: {spec.accepted} of {spec.proposed}"


def test_an_end_of_sequence_inside_a_draft_ends_the_lane_there():
    # The model goes 32, 33, 511 (EOS); the history holds that run after
    # [30, 31, 32], so once 32 is out the draft is [33, 511, ...].
    cfg = copying()
    prompt = [30, 31, 32, 33, 511, 40, 30, 31]
    params = SamplingParams()
    plain = generate(cfg, False, params, Sampling.GPU_GREEDY, prompt, 2, 16)
    spec = generate(cfg, True, params, Sampling.GPU_GREEDY, prompt, 2, 16)
    assert plain.finish == Finish.EOS
    assert plain.tokens == [32, 33, 511]
    assert spec.proposed > 0, "the EOS came inside a draft"
    assert (spec.tokens, spec.finish) == (plain.tokens, plain.finish), "nothing after the EOS"


def registration_status(h: Harness, kernel_capability: int) -> Status | None:
    try:
        register_prompt_lookup_with(h, bytes([1]) * 32, bytes([2]) * 32, kernel_capability)
    except StatusError as err:
        return err.status
    return None


def test_registration_needs_rows_at_every_position_and_a_partial_rollback():
    h = harness(dataclasses.replace(copying(), verify_rows=False))
    assert registration_status(h, 0) == Status.REGISTRATION_REFUSED
    h = harness(dataclasses.replace(copying(), truncate_partial=False))
    assert registration_status(h, 0) == Status.REGISTRATION_REFUSED
    h = harness(copying())
    assert registration_status(h, 1) == Status.REGISTRATION_REFUSED, "no kernel capability is on offer"
    slot, certs = register_prompt_lookup_with(h, bytes([1]) * 32, bytes([2]) * 32, 0)
    assert slot != 0
    assert len(certs) == 1
    assert certs[0].exactness == Exactness.DISTRIBUTION_EXACT
    assert certs[0].sampling_modes == CertMode.GREEDY | CertMode.GUMBEL


def test_a_slot_that_was_never_granted_is_refused_at_admission():
    h = harness(copying())
    p = h.prompt([1, 2, 3])
    st = h.tick_err(h.plan().admit(1, p, strategy_slot=9).prefill(1, 0, 3))
    assert st == Status.REJECT_ILLEGAL_COMBINATION


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-q"]))

"""Lanes that ask for logprobs (sf_trt.executor): one entry per emitted token, from the
rows that drew it, bit-identical with speculation on and off; Decode(max_draft)."""

from __future__ import annotations

import numpy as np
import pytest

from lanes import DIGEST, ID
from sf_trt.abi import Sampling, SamplingFlag, SamplingParams, Status
from sf_trt.engine import TOP_LOGPROBS_MAX
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.testing import Harness, register_prompt_lookup_with

CFG = FakeConfig(vocab=37, eos=36, copy_model=True, copy_miss_every=3, verify_rows=True, max_lanes=6, max_context=200, top_k_limit=16)


def run_lane(prompt, mode, params, *, speculate, logprobs, budgets=(5, 3, 8, 16), seed=11):
    """One lane (beside a bystander lane that speculates) to its finish: tokens, logprobs, spec counts."""
    h = Harness.with_engine(Executor(FakePrimitives(CFG), ExecutorConfig()))
    slot, _ = register_prompt_lookup_with(h, ID, DIGEST, 0)
    p = h.prompt(prompt)
    b = h.prompt([3, 4, 5, 3, 4, 5, 3])
    plan = h.plan().admit(1, p, strategy_slot=slot if speculate else 0, sampling=mode, params=params, rng_counter_base=seed, logprobs=logprobs)
    plan.admit(2, b, strategy_slot=slot, sampling=Sampling.GPU_GUMBEL, params=SamplingParams(temperature=0.7, flags=SamplingFlag.IGNORE_EOS))
    h.tick_ok(plan.prefill(1, 0, len(prompt)).prefill(2, 0, 7))
    tokens, parts, proposed, drafts = [], [], 0, 0
    for i in range(100):
        plan = h.plan().decode(1, budgets[i % len(budgets)])
        if 2 in h.engine.lanes:
            plan.decode(2, 4)
        e = h.tick_ok(plan).emit_for(1)
        new = h.rings_tokens(e.token_ref)
        tokens += new
        proposed += e.spec.proposed
        drafts += e.spec.drafts
        assert e.logprobs is not None and len(e.logprobs) == len(new)
        parts.append(e.logprobs)
        if e.finish:
            break
    lp = np.concatenate([x.logprob for x in parts])
    ids = np.concatenate([x.top_ids for x in parts])
    top = np.concatenate([x.top_logprobs for x in parts])
    return tokens, lp, ids, top, proposed, drafts


@pytest.mark.parametrize("mode, params", [
    (Sampling.GPU_GREEDY, SamplingParams(max_tokens=60)),
    (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=60)),
    (Sampling.GPU_GUMBEL, SamplingParams(temperature=1.3, top_k=5, min_p=0.05, max_tokens=60, flags=SamplingFlag.IGNORE_EOS)),
])
@pytest.mark.parametrize("k", [0, 3, TOP_LOGPROBS_MAX])
def test_logprobs_are_bit_identical_with_speculation_on_and_off(mode, params, k):
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 5, 6, 1, 2, 3]
    plain = run_lane(prompt, mode, params, speculate=False, logprobs=k)
    spec = run_lane(prompt, mode, params, speculate=True, logprobs=k)
    assert spec[0] == plain[0]
    for a, b in zip(plain[1:4], spec[1:4]):
        np.testing.assert_array_equal(a, b)
    assert spec[4] > 0 and spec[5] > 0 and plain[4] == plain[5] == 0  # it did speculate
    tokens, lp, ids, top = plain[:4]
    assert ids.shape == (len(tokens), k) and top.shape == (len(tokens), k)
    assert (lp <= 0).all() and np.isfinite(lp).all()
    if k:
        assert (top[:, 0] >= lp).all()
        if mode == Sampling.GPU_GREEDY:  # greedy draws the most likely token
            np.testing.assert_array_equal(ids[:, 0], tokens)
            np.testing.assert_array_equal(top[:, 0], lp)


def test_lanes_without_logprobs_get_none_and_max_draft_zero_turns_drafting_off_for_the_tick():
    h = Harness.with_engine(Executor(FakePrimitives(CFG), ExecutorConfig()))
    slot, _ = register_prompt_lookup_with(h, ID, DIGEST, 0)
    p = h.prompt([1, 2, 3, 1, 2, 3, 1, 2])
    h.tick_ok(h.plan().admit(1, p, strategy_slot=slot).prefill(1, 0, 8))
    e = h.tick_ok(h.plan().decode(1, 8, max_draft=0)).emit_for(1)
    assert e.logprobs is None and e.spec.proposed == 0 and e.passes == 8
    e = h.tick_ok(h.plan().decode(1, 8, max_draft=2)).emit_for(1)
    assert 0 < e.spec.proposed <= 2 * e.passes and e.spec.drafts <= e.passes


def test_bad_logprobs_and_max_draft_are_refused():
    h = Harness.with_engine(Executor(FakePrimitives(CFG), ExecutorConfig()))
    p = h.prompt([1, 2])
    assert h.tick_err(h.plan().admit(1, p, logprobs=TOP_LOGPROBS_MAX + 1)) == Status.BAD_ARGUMENT
    assert "logprobs must be None or an int in 0..20" in str(h.last_error)
    assert h.tick_err(h.plan().admit(1, p, logprobs=True)) == Status.BAD_ARGUMENT
    h.tick_ok(h.plan().admit(1, p).prefill(1, 0, 2))
    assert h.tick_err(h.plan().decode(1, 4, max_draft=-1)) == Status.BAD_ARGUMENT
    assert "decode(lane=1, n=4): max_draft must be None or an int >= 0" in str(h.last_error)


def test_logprobs_are_a_backend_capability_a_lane_without_it_is_refused_and_nothing_runs():
    import dataclasses

    from sf_trt.abi import StatusError

    prims = FakePrimitives(CFG)
    prims.capabilities = dataclasses.replace(prims.capabilities, logprobs=False)
    h = Harness.with_engine(Executor(prims, ExecutorConfig()))
    p = h.prompt([1, 2, 3])
    assert h.tick_err(h.plan().admit(1, p, logprobs=2).prefill(1, 0, 3)) == Status.UNSUPPORTED
    assert h.engine.lanes == []
    with pytest.raises(StatusError, match="this backend does not report logprobs"):
        prims.logprobs(np.zeros((1, CFG.vocab), np.float32), np.array([0]), np.array([1]))
    ev = h.tick_ok(h.plan().admit(1, p).prefill(1, 0, 3).decode(1, 4))  # the same lane without logprobs runs
    assert ev.emit_for(1).logprobs is None

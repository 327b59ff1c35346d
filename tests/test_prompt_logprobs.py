"""Prompt logprobs: from the prefill's own rows, exact however the prefill is chunked.

The row at position j scores prompt token j + 1, so a prompt's logprobs come with its
prefill, no second pass. They are the very values the decode path reports for the same
tokens at the same positions (the rows are bit-identical however a pass is packed and
the logprobs graph reads each row alone): scoring a prompt that continues with what a
greedy decode emitted gives that decode's logprobs bit for bit. On the real model, an
lm-eval-style loglikelihood (the sum over a continuation) equals a direct computation.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sf_trt.abi import Sampling, SamplingParams, Status, StatusError
from sf_trt.engine import TokenLogprobs
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.testing import Harness

VOCAB, EOS = 40, 39
CFG = FakeConfig(vocab=VOCAB, eos=EOS, copy_model=True, copy_miss_every=4, verify_rows=True, max_lanes=4, max_context=128, top_k_limit=16)


def score(h: Harness, lane: int, prompt: list[int], chunk: int, k: int = 5, others=()) -> TokenLogprobs:
    """Prefill ``prompt`` in chunks of ``chunk`` (beside ``others``: (lane, prompt) prefilled
    in the same ticks); the prompt logprobs the emits carried, in order."""
    pid = h.prompt(prompt)
    plan = h.plan().admit(lane, pid, prompt_logprobs=k)
    for other, toks in others:
        plan.admit(other, h.prompt(toks)).prefill(other, 0, len(toks))
    parts, start = [], 0
    while start < len(prompt):
        n = min(chunk, len(prompt) - start)
        ev = h.tick_ok(plan.prefill(lane, start, n))
        parts.append(ev.emit_for(lane).prompt_logprobs)
        start += n
        plan = h.plan()
    h.tick_ok(h.plan().release(lane))
    for other, _ in others:
        h.tick_ok(h.plan().release(other))
    return TokenLogprobs.concat(parts, k)


def same(a: TokenLogprobs, b: TokenLogprobs) -> None:
    for name in ("logprob", "top_ids", "top_logprobs"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_prompt_logprobs_are_the_same_however_the_prefill_is_chunked_or_packed():
    h = Harness.with_engine(Executor(FakePrimitives(CFG)))
    prompt = [3, 5, 7, 3, 5, 9, 11, 3, 5, 7, 2, 1, 0, 3]
    whole = score(h, 1, prompt, 64)
    assert len(whole) == len(prompt) - 1  # every token but the first; the last prompt token's row draws the output
    assert np.all(whole.logprob <= 0) and np.all(np.diff(whole.top_logprobs, axis=1) <= 0)
    for chunk in (1, 3, 5):
        same(score(h, 2, prompt, chunk), whole)
    same(score(h, 1, prompt, 4, others=[(2, [1, 2, 3, 4, 5]), (3, [9] * 9)]), whole)


def test_prompt_logprobs_are_the_decode_paths_logprobs_of_the_same_tokens():
    """Greedy-decode from a context with logprobs; score context + output as a prompt: the
    output's prompt logprobs are the decode's, bit for bit."""
    h = Harness.with_engine(Executor(FakePrimitives(CFG)))
    context = [3, 5, 7, 3, 5, 9]
    ev = h.tick_ok(h.plan().admit(1, h.prompt(context), params=SamplingParams(max_tokens=8), logprobs=5).prefill(1, 0, len(context)).decode(1, 8))
    e = ev.emit_for(1)
    out = h.rings_tokens(e.token_ref)
    scored = score(h, 2, context + out, 3)
    same(scored[len(context) - 1 :], e.logprobs)


def test_prompt_logprobs_are_refused_without_verify_rows_or_out_of_range():
    h = Harness.with_engine(Executor(FakePrimitives(FakeConfig(vocab=VOCAB, eos=EOS))))
    p = h.prompt([1, 2, 3])
    assert h.tick_err(h.plan().admit(1, p, prompt_logprobs=2)) == Status.UNSUPPORTED
    h = Harness.with_engine(Executor(FakePrimitives(CFG)))
    with pytest.raises(StatusError, match=r"admit\(lane=1\): prompt_logprobs must be None or an int in 0..20 \(got 21\)"):
        h.engine.tick(h.plan().admit(1, h.prompt([1, 2]), prompt_logprobs=21))


def test_a_prompt_only_request_scores_its_prompt_and_generates_nothing():
    from sf_trt.abi import Finish
    from sf_trt.generate import Generator
    from sf_trt.scheduler import Request

    prompt = [3, 5, 7, 3, 5, 9, 11, 3, 5, 7, 2, 1, 0, 3]
    h = Harness.with_engine(Executor(FakePrimitives(CFG)))
    want = score(h, 1, prompt, 64)
    gen = Generator(FakePrimitives(CFG), prefill_chunk=4)
    plain, scored = gen.run([Request(prompt, prompt_logprobs=5, params=SamplingParams(max_tokens=3)), Request(prompt, prompt_logprobs=5, prompt_only=True)])
    assert scored.tokens == [] and scored.finish == Finish.LENGTH
    assert len(plain.tokens) == 3
    same(scored.prompt_logprobs, want)
    same(plain.prompt_logprobs, want)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=40), chunk=st.integers(1, 12),
       others=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20), max_size=2), k=st.integers(0, 20),
       prefill_rows=st.integers(1, 16))
def test_prompt_logprobs_are_exact_under_any_chunking_packing_and_pass_size(prompt, chunk, others, k, prefill_rows):
    whole = score(Harness.with_engine(Executor(FakePrimitives(CFG))), 1, prompt, 64, k)
    h = Harness.with_engine(Executor(FakePrimitives(CFG), ExecutorConfig(max_prefill_rows=prefill_rows)))
    same(score(h, 1, prompt, chunk, k, others=[(2 + i, o) for i, o in enumerate(others)]), whole)

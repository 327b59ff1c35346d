"""The ABI (sf_trt.abi): sampling parameters refuse what they cannot mean."""

from __future__ import annotations

import functools
import math

import pytest

from sf_trt.abi import TEMPERATURE_MIN, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.testing import Harness

SAMPLING = {
    "temperature NaN": (dict(temperature=math.nan), "temperature"),
    "temperature infinite": (dict(temperature=math.inf), "temperature"),
    "temperature negative": (dict(temperature=-0.1), "temperature"),
    "temperature below the floor": (dict(temperature=1e-40), "temperature"),
    "temperature just below the floor": (dict(temperature=TEMPERATURE_MIN / 2), "temperature"),
    "temperature past float32": (dict(temperature=1e39), "temperature"),
    "temperature a string": (dict(temperature="1"), "temperature"),
    "top_p 0": (dict(top_p=0.0), "top_p"),
    "top_p above 1": (dict(top_p=1.5), "top_p"),
    "top_p NaN": (dict(top_p=math.nan), "top_p"),
    "top_k negative": (dict(top_k=-1), "top_k"),
    "top_k a float": (dict(top_k=1.5), "top_k"),
    "max_tokens negative": (dict(max_tokens=-1), "max_tokens"),
    "max_tokens a bool": (dict(max_tokens=True), "max_tokens"),
    "unknown flags": (dict(flags=8), "flags"),
    "presence_penalty past 2": (dict(presence_penalty=2.5), "presence_penalty"),
    "frequency_penalty NaN": (dict(frequency_penalty=math.nan), "frequency_penalty"),
    "repetition_penalty 0": (dict(repetition_penalty=0.0), "repetition_penalty"),
    "logit_bias past 100": (dict(logit_bias={3: 101}), "logit_bias"),
    "logit_bias key not a token id": (dict(logit_bias={-1: 1.0}), "logit_bias"),
    "logit_bias not a mapping": (dict(logit_bias="x"), "logit_bias"),
    "min_tokens past max_tokens": (dict(min_tokens=5, max_tokens=3), "min_tokens"),
    "stop_token_ids a float": (dict(stop_token_ids=[1.5]), "stop_token_ids"),
}

REFUSALS = {case: functools.partial(SamplingParams, **kwargs) for case, (kwargs, _) in SAMPLING.items()}
"""Every refusal above as a call that raises it, by the name docs/errors.md gives it."""


@pytest.mark.parametrize("case", list(SAMPLING))
def test_sampling_params_refuse_bad_values(case):
    kwargs, field = SAMPLING[case]
    with pytest.raises(StatusError) as err:
        SamplingParams(**kwargs)
    assert err.value.status == Status.BAD_SAMPLING_PARAMS
    assert "SamplingParams" in str(err.value) and field in str(err.value)


def test_at_the_temperature_floor_sampling_is_sharp_and_exact():
    """TEMPERATURE_MIN is accepted and samples; its draws are the argmax on the fake's rows."""
    from sf_trt.executor import Executor

    h = Harness.with_engine(Executor(FakePrimitives(FakeConfig(vocab=64, eos=63, copy_model=True))))
    p = h.prompt([1, 2, 3, 1, 2])
    params = SamplingParams(temperature=TEMPERATURE_MIN, flags=SamplingFlag.IGNORE_EOS)
    sampled = h.tick_ok(h.plan().admit(1, p, sampling=Sampling.GPU_GUMBEL, params=params).prefill(1, 0, 5).decode(1, 8)).emit_for(1)
    greedy = h.tick_ok(h.plan().admit(2, p, params=params).prefill(2, 0, 5).decode(2, 8)).emit_for(2)
    assert h.rings_tokens(sampled.token_ref) == h.rings_tokens(greedy.token_ref)

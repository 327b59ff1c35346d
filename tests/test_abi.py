"""The ABI (sf_trt.abi): sampling parameters refuse what they cannot mean."""

from __future__ import annotations

import math

import pytest

from sf_trt.abi import SamplingParams, Status, StatusError


@pytest.mark.parametrize(
    "kwargs, field",
    [(dict(temperature=math.nan), "temperature"), (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"),
     (dict(top_p=1.5), "top_p"), (dict(top_p=math.nan), "top_p"), (dict(top_k=-1), "top_k"),
     (dict(max_tokens=-1), "max_tokens"), (dict(top_k=1.5), "top_k"), (dict(flags=8), "flags")],
)
def test_sampling_params_refuse_bad_values(kwargs, field):
    with pytest.raises(StatusError) as err:
        SamplingParams(**kwargs)
    assert err.value.status == Status.BAD_SAMPLING_PARAMS
    assert "SamplingParams" in str(err.value) and field in str(err.value)

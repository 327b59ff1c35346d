"""What a TensorRT build depends on (sf_trt.export.trt_config)."""

from __future__ import annotations

import pytest
from sf_trt.export.trt_config import BuildConfig, BuildError, precision_for


def test_build_config_refuses_bad_values_with_what_it_got():
    with pytest.raises(BuildError, match=r"precision 'int8', expected one of \['fp32', 'fp16', 'bf16'\]"):
        BuildConfig(precision="int8")
    with pytest.raises(BuildError, match=r"max_lanes must be an int >= 1 \(got 0\)"):
        BuildConfig(max_lanes=0)
    with pytest.raises(BuildError, match=r"opt_rows_per_pass must be an int in 1..max_rows_per_pass=16 \(got 17\)"):
        BuildConfig(max_rows_per_pass=16, opt_rows_per_pass=17)


def test_the_verify_graph_is_built_in_fp32():
    cfg = BuildConfig(precision="bf16")
    assert precision_for("verify", cfg) == "fp32" and precision_for("decoder", cfg) == "bf16"

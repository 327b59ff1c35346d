"""tools/profile_decode.py: time per token inside and outside the decoder pass, on the path `sf-trt generate` takes."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_plain_decode_runs_one_pass_per_token_and_a_sampler_run_only_when_sampled(real_int8_model_dir, sample, capsys, load_tool):
    """A plain greedy decode makes one decoder run per token (plus the prefill's) and no sampler
    run at all: the decoder's own ArgMax output is the token. Sampled, each token costs one sampler
    run. The times the tool reports add up (pass + outside = the decode's time per token)."""
    argv = ["--weights", "int8", "--max-tokens", "8", "--threads", "1", "--json"] + (["--sample"] if sample else [])
    load_tool("profile_decode").main(argv)
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["weights"] == "int8" and out["tokens"] == 8 and out["sampled"] is sample
    assert out["decoder_runs"] == out["tokens"] + 1  # the prompt's prefill, then one pass per token
    assert out["sampler_runs"] == (out["tokens"] if sample else 0)
    assert out["decoder_pass_ms_per_token"] > 0 and out["outside_pass_ms_per_token"] > 0
    total = out["decoder_pass_ms_per_token"] + out["outside_pass_ms_per_token"]
    assert total == pytest.approx(out["decode_ms_per_token"], abs=0.01)


@pytest.mark.slow
def test_many_lanes_and_the_op_profile(real_int8_model_dir, capsys, load_tool):
    """--lanes 2 runs the file's first two prompts at once, and --ops
    adds onnxruntime's per-op profile of a 2-row pass whose shares add up to the whole."""
    load_tool("profile_decode").main(["--weights", "int8", "--max-tokens", "6", "--threads", "1", "--lanes", "2", "--ops", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["lanes"] == 2 and out["tokens"] == 12 and out["prompt_ids"] == ["typehints", "fix_typo"]
    assert out["decode_tokens_per_s"] > 0 and out["prefill_s"] > 0  # the two prefills are measured apart
    ops = out["ops"]
    assert ops["lanes"] == 2 and ops["kernel_ms_per_pass"] > 0
    assert sum(ops["share"].values()) == pytest.approx(1.0, abs=1e-3)
    assert {"MatMulNBits", "ScatterND"} <= set(ops["share"])  # int8 matmuls; the cache write (docs/benchmarks.md)

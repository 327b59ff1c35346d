"""tools/bench_fusions.py: the decoder pass with and without onnxruntime's fused ops, alternating in one process."""

from __future__ import annotations

import pytest

VARIANTS = ["unfused", "rotary", "skip_norm", "fused", "attention", "runtime"]


@pytest.mark.slow
def test_every_variant_times_every_case_and_the_graphs_it_wrote_are_removed(real_int8_model_dir, capsys, load_tool):
    load_tool("bench_fusions").main(["--rounds", "1", "--cases", "decode@200,verify9@200", "--threads", "1", "--variants", ",".join(VARIANTS)])
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("| case |"))
    assert [c.split(":")[0] for c in header.strip("| ").split(" | ")[1:7]] == list(VARIANTS)
    rows = {line.split(" | ")[0].strip("| "): line for line in lines if line.startswith("| decode") or line.startswith("| verify")}
    assert set(rows) == {"decode@200", "verify9@200"}
    assert all(row.count("x |") == len(VARIANTS) - 1 for row in rows.values())  # each variant's ratio to the unfused graph
    assert not list(real_int8_model_dir.glob(".bench_fusions_*"))


def test_an_unknown_variant_is_refused_with_the_known_ones(load_tool, capsys):
    with pytest.raises(SystemExit):
        load_tool("bench_fusions").main(["--variants", "unfused,fastest"])
    assert "'fastest' unknown (known: unfused, rotary, skip_norm, fused, attention, runtime)" in capsys.readouterr().err


@pytest.mark.slow
def test_ops_profiles_each_case_and_variant_with_the_attention_and_weight_rates(real_int8_model_dir, capsys, load_tool):
    load_tool("bench_fusions").main(["--rounds", "1", "--cases", "decode@200", "--threads", "1", "--variants", "unfused,runtime", "--ops"])
    out = capsys.readouterr().out
    assert "numpy's float32 SGEMM (2048^3) here: " in out
    rows = {tuple(line.split(" | ")[:2]): line.split(" | ") for line in out.splitlines() if line.startswith("| decode@200 | ")}
    unfused, runtime = rows[("| decode@200", "unfused")], rows[("| decode@200", "runtime")]
    assert unfused[3] == "-" and runtime[3] != "-"  # the attention's rate where it is one op
    for cells in (unfused, runtime):
        assert float(cells[2]) > 0 and float(cells[4].split(" (")[1].rstrip(")")) > 0  # kernel ms, the weight matmuls' GFLOP/s
    assert not list(real_int8_model_dir.glob(".bench_fusions_*"))

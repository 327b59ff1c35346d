"""tools/bench_serve.py --ab-flag: two real servers side by side (the fake backend), one given the flag."""

from __future__ import annotations

import json


def test_ab_flag_runs_both_servers_and_reports_each_ones_first_token_times(load_tool, capsys, tmp_path):
    out = tmp_path / "ab.json"
    assert load_tool("bench_serve").main(["--ab-flag=--no-first-token-tick", "--serve-flag=--backend=fake", "--max-context", "4096",
                                          "--concurrency", "2", "--repeats", "2", "--max-tokens", "8", "--min-requests", "2",
                                          "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "`sf-trt serve` with `--no-first-token-tick` and without" in printed
    (row,) = json.loads(out.read_text())["rows"]
    assert row["concurrency"] == 2
    for side in ("with", "without"):
        assert row[f"{side}_median_ttft_ms"] > 0 and row[f"{side}_output_throughput"] > 0
    assert printed.splitlines()[-1].startswith("| 2 | ")

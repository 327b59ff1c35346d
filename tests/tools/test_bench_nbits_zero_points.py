"""tools/bench_nbits_zero_points.py: MatMulNBits with no, uint8 and float zero points, timed and checked for row exactness."""

from __future__ import annotations

import json

import pytest


def test_each_way_is_timed_and_the_integer_ways_keep_rows_exact(load_tool, capsys, tmp_path):
    out = tmp_path / "zp.json"
    assert load_tool("bench_nbits_zero_points").main(["--k", "256", "--n", "64", "--passes", "2", "--threads", "2", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert list(doc["ways"]) == ["none", "uint8", "float"]
    assert all(r["ms_1_rows"] > 0 and r["ms_9_rows"] > 0 for r in doc["ways"].values())
    # what the export relies on: without zero points and with uint8 ones a row is the same alone and in a pass of 9
    assert doc["ways"]["none"]["row_exact"] and doc["ways"]["uint8"]["row_exact"]
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and not line.startswith("| zero")]
    assert [line.split(" | ")[0] for line in table] == ["| none", "| uint8", "| float"]


def test_a_k_that_is_not_whole_blocks_is_refused(load_tool, capsys):
    with pytest.raises(SystemExit):
        load_tool("bench_nbits_zero_points").main(["--k", "100"])
    assert "--k 100: not a multiple of the block, 32" in capsys.readouterr().err

"""tools/bench_targets.py's table and step parsing on a canned run's JSON (the real run needs the
peers' engines and models; docs/benchmarks.md has it)."""

from __future__ import annotations

import json

import pytest


def _peers_report(sf_plain, llama_plain, genai_plain, sf_spec, llama_spec, genai_spec, *, genai=True):
    """A tools/bench_peers.py report of one grounded and one open prompt, 10 tokens each run."""
    names = ["llama.cpp"] + (["genai"] if genai else [])
    spec = {"llama.cpp": llama_spec, "genai": genai_spec}

    def prompt(pid, kind):
        return {
            "id": pid, "kind": kind,
            "peers": {n: {"plain": {"tokens": 10, "tokens_per_s": 1.0}, "lookup": {"tokens": 10, "tokens_per_s": spec[n]},
                          "identical": n == "genai"} for n in names},
            "sf_trt": {"identical": True, "spec_tokens": 10, "spec_tokens_per_s": sf_spec},
        }

    engines = {"sf_trt": {"tokens_per_s": sf_plain, "bytes_per_token": 1e9, "fraction_of_limit": sf_plain * 1e9 / 10e9},
               "llama.cpp": {"tokens_per_s": llama_plain}}
    if genai:
        engines["genai"] = {"tokens_per_s": genai_plain}
    return {"settings": {"peers": names}, "results": [prompt("a", "grounded"), prompt("b", "open")],
            "limit": {"bandwidth": {"bytes_per_s": 10e9}, "engines": engines}}


def _doc():
    return {"steps": {
        "peers-135m-spin": {"status": "ok", "report": _peers_report(50.0, 40.0, 60.0, 90.0, 50.0, 60.0)},
        "peers-1b-spin": {"status": "ok", "report": _peers_report(8.0, 5.0, None, 8.0, 6.0, None, genai=False)},
        "peers-1b-sleep": {"status": "cut off", "note": "past 450 s"},
        "lanes-135m": {"status": "ok", "ratio_plain": 4.5, "runs": {"8": {"throughput_tokens_per_s": {"plain": 90.0}},
                                                                   "1": {"throughput_tokens_per_s": {"plain": 20.0}}}},
        "memory-1b": {"status": "ok", "ratio": 1.5, "peak_rss_bytes": 1.5e9, "weight_bytes": 1e9},
    }}


def _row(rows, target, where):
    return next(r for r in rows if r["target"] == target and r["where"] == where)


def test_each_target_is_met_or_not_from_ratios_within_one_steps_run(load_tool):
    bt = load_tool("bench_targets")
    rows = bt.target_rows(_doc())
    r = _row(rows, "plain_vs_llama.cpp", "135M, threads spin")
    assert r["measured"] == pytest.approx(1.25) and r["met"] is True  # the threshold itself counts as met
    r = _row(rows, "plain_vs_genai", "135M, threads spin")
    assert r["measured"] == pytest.approx(50 / 60) and r["met"] is False
    r = _row(rows, "spec_vs_best", "135M, threads spin")  # best peer is genai's 60 on the grounded prompt
    assert r["measured"] == pytest.approx(1.5) and r["met"] is True
    assert "best peer genai" in r["note"] and "genai 2/2" in r["note"] and "llama.cpp 0/2" in r["note"] and "sf_trt 2/2" in r["note"]
    assert _row(rows, "lanes-135m", "135M")["met"] is True
    r = _row(rows, "memory", "1.1B")
    assert r["measured"] == 1.5 and r["met"] is False  # at most 1.3x
    r = _row(rows, "bandwidth", "1.1B, threads spin")
    assert r["measured"] == pytest.approx(0.8) and r["met"] is True


def test_what_was_not_measured_says_why_and_is_neither_met_nor_missed(load_tool):
    bt = load_tool("bench_targets")
    rows = bt.target_rows(_doc())
    r = _row(rows, "plain_vs_genai", "1.1B, threads spin")
    assert r["met"] is None and "genai not in this run" in r["note"]
    r = _row(rows, "plain_vs_llama.cpp", "1.1B, threads sleep")
    assert r["met"] is None and "cut off" in r["note"] and "past 450 s" in r["note"]
    assert _row(rows, "lanes-1b", "1.1B")["note"] == "not run"
    assert "random weights" in _row(rows, "spec_vs_best", "1.1B, threads spin")["note"]


def test_the_markdown_table_has_a_row_per_target_and_place(load_tool):
    bt = load_tool("bench_targets")
    text = bt.render_table(_doc())
    lines = text.splitlines()
    assert lines[0].startswith("| target |") and len(lines) == 2 + len(bt.target_rows(_doc()))
    assert "| 1.25× | met |" in text and "| 80% | met |" in text and "| 1.50× | not met |" in text


def test_table_refuses_a_file_that_is_not_a_runs_json_naming_it(load_tool, tmp_path, capsys):
    bt = load_tool("bench_targets")
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"results": []}))
    assert bt.main(["table", str(bad)]) == 2
    assert "x.json" in capsys.readouterr().err
    good = tmp_path / "run.json"
    good.write_text(json.dumps(_doc()))
    assert bt.main(["table", str(good)]) == 0
    assert "| Plain decode ≥ 1.25× llama.cpp | 135M, threads spin | 1.25× | met |" in capsys.readouterr().out


def test_steps_keep_the_runs_order_and_unknown_ones_are_refused(load_tool):
    bt = load_tool("bench_targets")
    assert bt.parse_steps("memory-1b,peers-135m-spin") == ["peers-135m-spin", "memory-1b"]
    assert bt.parse_steps(None) == list(bt.STEPS)
    with pytest.raises(SystemExit, match="unknown peers-7b"):
        bt.parse_steps("peers-7b")


def test_prompts_are_cut_for_the_1b_tokenizer_and_keep_their_kind(load_tool, tmp_path):
    bt = load_tool("bench_targets")
    path = bt.prompts_file(("fix_typo", "vaccines"), 50, 7, tmp_path / "p.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["fix_typo", "vaccines"] and [r["kind"] for r in rows] == ["grounded", "open"]
    assert all(len(m["content"]) <= 50 for r in rows for m in r["messages"]) and {r["max_tokens"] for r in rows} == {7}


def test_a_step_process_past_its_limit_is_cut_off_and_its_peak_rss_is_its_own(load_tool):
    import sys

    bt = load_tool("bench_targets")
    status, _out, _err, _usage = bt.run_process([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    assert status is None
    status, out, _err, usage = bt.run_process([sys.executable, "-c", "b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096]); print('ok')"], 60)
    assert status == 0 and out.strip() == "ok" and usage.ru_maxrss * 1024 >= 200 << 20


def test_run_refuses_an_sf_trt_command_that_is_not_there_naming_it(load_tool, tmp_path, capsys):
    bt = load_tool("bench_targets")
    assert bt.main(["run", "--sf-trt-cmd", str(tmp_path / "no-sf-trt"), "--steps", "bandwidth", "--json", str(tmp_path / "t.json")]) == 2
    assert "no-sf-trt" in capsys.readouterr().err and not (tmp_path / "t.json").exists()


def test_a_lanes_ratio_is_none_where_sf_trt_bench_gave_no_decode_only_rate(load_tool):
    """``sf-trt bench`` gives ``null`` for a run that is nearly all prefill: no ratio, no TypeError."""
    ratio = load_tool("bench_targets")._ratio
    assert ratio(10.0, 5.0) == 2.0
    assert ratio(None, 5.0) is None and ratio(10.0, None) is None and ratio(10.0, 0.0) is None

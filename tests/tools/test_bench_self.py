"""tools/bench_self.py: sf_trt's cold and warm numbers per window and wait policy (run, not timed)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def tiny_chat_model_dir(tmp_path_factory):
    """The tiny random Llama exported with its tokenizer and chat template (context 512)."""
    from tiny_gguf import write_tiny_gguf

    from sf_trt.export.pipeline import export_model_dir

    root = tmp_path_factory.mktemp("tiny_chat")
    write_tiny_gguf(root / "tiny.gguf")
    return export_model_dir(root / "tiny.gguf", root / "model", progress=False)


def test_the_tool_runs_every_window_and_wait_and_reports_its_fields(tiny_chat_model_dir, load_tool, tmp_path, capsys):
    out = tmp_path / "self.json"
    code = load_tool("bench_self").main([
        "--model", str(tiny_chat_model_dir), "--windows", "fit,512", "--long-tokens", "200", "--decode-tokens", "4",
        "--rounds", "1", "--threads", "1", "--json", str(out),
    ])
    assert code == 0
    report = json.loads(out.read_text())
    assert [(r["window"], r["wait"]) for r in report["rows"]] == [(256, "sleep"), (256, "spin"), (512, "sleep"), (512, "spin")]
    assert report["long_prompt_tokens"] == 200 and report["short_prompt_tokens"] > 0 and report["failed"] == []
    for row in report["rows"]:
        for name in ("short_cold", "short_warm", "long_cold", "long_warm"):
            assert row[name]["wall_s"] > 0 and row[name]["cpu_s"] >= 0 and 0 < row[name]["first_token_s"] <= row[name]["wall_s"]
        assert row["decode"]["tokens"] == 3 and row["decode"]["tokens_per_s"] > 0
    table = capsys.readouterr().out
    assert "short cold s (cpu)" in table and "decode tok/s" in table and "REGRESSION" not in table


def _row(window, wait, cold_cpu, warm_cpu, decode_ms):
    return {"window": window, "wait": wait, "short_cold": {"cpu_s": cold_cpu}, "short_warm": {"cpu_s": warm_cpu},
            "decode": {"cpu_ms_per_token": decode_ms}}


def test_check_names_a_costly_first_request_and_a_decode_that_grows_with_the_window(load_tool):
    tool = load_tool("bench_self")
    # as measured before the KV cache left transparent huge pages (load 5): 0.944 s cold against 0.075 s warm
    failed = tool.check([_row(1280, "sleep", 0.080, 0.090, 13.8), _row(8192, "sleep", 0.944, 0.075, 14.2)])
    assert failed == ["cold_short (window 8192, sleep): 0.944 s CPU to the first token of the short prompt as the first "
                      "request against 0.075 warm: 12.59x, allowed 2.0x"]
    failed = tool.check([_row(1280, "spin", 0.1, 0.1, 10.0), _row(8192, "spin", 0.1, 0.1, 13.0)])
    assert failed == ["decode_window (spin): 13.000 ms CPU per decoded token at window 8192 against 10.000 at 1280: 1.30x, allowed 1.25x"]
    # after (the same run): 0.086 / 0.076 and 0.079 / 0.074; one window alone has no decode ratio
    assert tool.check([_row(1280, "sleep", 0.086, 0.076, 13.9), _row(8192, "sleep", 0.079, 0.074, 14.2), _row(8192, "spin", 0.1, 0.1, 50.0)]) == []


@pytest.mark.parametrize("argv, words", [(["--waits", "nap"], "--waits nap: expected sleep or spin"),
                                         (["--windows", "300"], "--windows 300: expected")])
def test_bad_flags_are_refused_naming_what_was_given(tiny_chat_model_dir, load_tool, argv, words):
    with pytest.raises(SystemExit, match=words):
        load_tool("bench_self").main(["--model", str(tiny_chat_model_dir), "--long-tokens", "400", *argv])

"""The load generator (cli/loadtest.py, ``sf-trt loadtest``): a short bounded run passes its own checks
against a live server; it fails a run with SSE errors; it talks to loopback only."""

from __future__ import annotations

import argparse
import asyncio
import json
import math

import pytest

from sf_trt.cli import build_parser
from sf_trt.cli.errors import CliError
from sf_trt.cli.loadtest import loadtest

from servers import POISON, FaultyFake, FAKE, live_server


def args(url: str, *extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["loadtest", "--url", url, *extra])


def test_a_short_bounded_run_passes_every_check_and_reports_vllms_fields(tmp_path):
    with live_server() as live:
        a = args(live.url, "--num-requests", "24", "--max-seconds", "60", "--request-rate", "200", "--arrival", "poisson",
                 "--max-concurrency", "10", "--verify", "6", "--json", str(tmp_path / "r.json"))
        report = asyncio.run(loadtest(a))
    assert report["failures"] == [], report["failures"]
    assert report["completed"] == 24 and report["failed"] == report["rejected"] == 0 and report["verified_alone"] == 6
    assert report["metrics_generation_tokens_delta"] == report["total_output_tokens"] > 0
    for name in ("request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "p90_tpot_ms",
                 "mean_itl_ms", "p50_itl_per_token_ms", "mean_e2el_ms", "p99_e2el_ms"):
        assert isinstance(report[name], float) and report[name] >= 0, name


def test_the_command_writes_json_and_exits_1_on_sse_errors(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt_ids": [1, 2, POISON], "max_tokens": 4}) + "\n" + json.dumps({"prompt": "fine", "max_tokens": 4}) + "\n")
    with live_server(FaultyFake(FAKE)) as live:
        a = args(live.url, "--num-requests", "4", "--prompts", str(prompts), "--json", str(tmp_path / "out.json"), "--verify", "0",
                 "--max-concurrency", "1")  # one at a time: a fault fails only the poisoned request
        assert a.func(a) == 1
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["completed"] == 2 and len(report["failures"]) == 2
    assert all("SSE error event" in f and "injected fault" in f for f in report["failures"])
    assert "FAIL: request 0" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["http://example.com:8000", "http://10.0.0.1:8000", "http://[2001:db8::1]:80"])
def test_it_refuses_hosts_other_than_this_machine(url):
    with pytest.raises(CliError, match="this machine only"):
        asyncio.run(loadtest(args(url)))
    assert math.isinf(args("http://127.0.0.1:1").request_rate)

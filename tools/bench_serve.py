"""Server throughput at several concurrencies, speculation off and on, beside `sf-trt bench`.

For each concurrency C: start `sf-trt serve --max-num-seqs C` on the default model
(the same --max-context as the bench), run `sf-trt loadtest` with C requests in
flight, speculation off and on (alternating, --repeats times, so a change in the
machine's load hits both alike), stop the server, then run `sf-trt bench --lanes C`
on the same prompts. Greedy, the bench prompts, each request seeded.

    python tools/bench_serve.py --concurrency 1,4,8,16 --max-tokens 96 --json bench_serve.json

Prints a table: output tok/s of the server plain and speculative, their ratio, the
bench's plain and speculative tok/s, and server / bench. Every loadtest also runs
its own checks (usage vs /metrics, no errors); a failed check fails the script.

``--ab-flag FLAG`` compares two servers instead, side by side at each concurrency: one
given FLAG, one without it (speculation as the server's default; ``--repeats`` loadtests
on each, alternating which goes first), and prints each one's median and p90 time to first
token and output tok/s:

    python tools/bench_serve.py --ab-flag=--no-first-token-tick --concurrency 1,4 --repeats 3 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(lanes: int, max_context: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sf_trt.cli", "serve", "--port", str(port), "--max-num-seqs", str(lanes),
           "--max-context", str(max_context), "--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("the server did not become healthy in 600 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    if proc.wait(60) != 0:
        raise SystemExit(f"the server exited {proc.returncode}")


def loadtest(url: str, args, concurrency: int, speculate: str) -> dict:
    """`sf-trt loadtest` against ``url``: its JSON report (its own checks failing fail the script)."""
    import tempfile

    n = max(args.min_requests, concurrency)
    with tempfile.TemporaryDirectory() as tmp:
        report_file = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "sf_trt.cli", "loadtest", "--url", url, "--prompts", str(args.prompts), "--num-requests", str(n),
               "--max-concurrency", str(concurrency), "--max-tokens", str(args.max_tokens), "--temperature", "0",
               "--speculate", speculate, "--verify", "0", "--max-seconds", "1800", "--json", str(report_file)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0 or not report_file.is_file():
            raise SystemExit(f"loadtest failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return json.loads(report_file.read_text())


def bench(args, lanes: int) -> dict:
    cmd = [sys.executable, "-m", "sf_trt.cli", "bench", "--prompts", str(args.prompts), "--lanes", str(lanes),
           "--max-tokens", str(args.max_tokens), "--max-context", str(args.max_context), "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"sf-trt bench failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)["throughput_tokens_per_s"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--prompts", type=Path, default=ROOT / "tools" / "prompts" / "bench.jsonl")
    ap.add_argument("--min-requests", type=int, default=8, help="requests per run: max(this, the concurrency)")
    ap.add_argument("--repeats", type=int, default=1, help="plain/speculative runs per concurrency, alternating")
    ap.add_argument("--no-bench", action="store_true", help="skip `sf-trt bench`")
    ap.add_argument("--serve-flag", action="append", default=[], help="an extra flag for `sf-trt serve` (repeatable)")
    ap.add_argument("--ab-flag", default=None, metavar="FLAG", help="compare a server with FLAG against one without (module docstring)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.ab_flag:
        return ab(args)
    rows = []
    print(f"load: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    for c in [int(x) for x in args.concurrency.split(",")]:
        proc, url = start_server(c, args.max_context, args.serve_flag)
        try:
            loadtest(url, args, c, "none")  # warm up
            runs = {"none": [], "prompt-lookup": []}
            for _ in range(args.repeats):
                for spec in ("none", "prompt-lookup"):
                    runs[spec].append(loadtest(url, args, c, spec))
        finally:
            stop_server(proc)
        row = {"concurrency": c}
        for spec, reports in runs.items():
            key = "plain" if spec == "none" else "spec"
            row[f"server_{key}_tok_s"] = round(sum(r["output_throughput"] for r in reports) / len(reports), 2)
            row[f"server_{key}_median_ttft_ms"] = round(sum(r["median_ttft_ms"] for r in reports) / len(reports), 1)
            row[f"server_{key}_median_tpot_ms"] = round(sum(r["median_tpot_ms"] for r in reports) / len(reports), 1)
        row["spec_over_plain"] = round(row["server_spec_tok_s"] / row["server_plain_tok_s"], 3)
        if not args.no_bench:
            b = bench(args, c)
            row.update(bench_plain_tok_s=b["plain"], bench_spec_tok_s=b["spec"],
                       server_over_bench_plain=round(row["server_plain_tok_s"] / b["plain"], 3),
                       server_over_bench_spec=round(row["server_spec_tok_s"] / b["spec"], 3))
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"load: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    head = "| C | server plain tok/s | server spec tok/s | spec / plain | bench plain | bench spec | server / bench (plain, spec) |"
    print(head + "\n|" + "---|" * 7)
    for r in rows:
        b = (f"{r['bench_plain_tok_s']} | {r['bench_spec_tok_s']} | {r['server_over_bench_plain']}, {r['server_over_bench_spec']}"
             if "bench_plain_tok_s" in r else "- | - | -")
        print(f"| {r['concurrency']} | {r['server_plain_tok_s']} | {r['server_spec_tok_s']} | {r['spec_over_plain']} | {b} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "settings": vars(args) | {"prompts": str(args.prompts), "json": str(args.json)}}, indent=2) + "\n")
    return 0


def ab(args) -> int:
    """``--ab-flag``: the two servers side by side at each concurrency (module docstring)."""
    rows = []
    load = [os.getloadavg()[0]]
    for c in [int(x) for x in args.concurrency.split(",")]:
        procs, urls = {}, {}
        try:
            for side, extra in (("with", [args.ab_flag]), ("without", [])):
                procs[side], urls[side] = start_server(c, args.max_context, [*args.serve_flag, *extra])
                loadtest(urls[side], args, c, "prompt-lookup")  # warm up
            reports = {side: [] for side in urls}
            for r in range(args.repeats):
                for side in (("with", "without") if r % 2 == 0 else ("without", "with")):
                    reports[side].append(loadtest(urls[side], args, c, "prompt-lookup"))
        finally:
            for proc in procs.values():
                stop_server(proc)
        row = {"concurrency": c}
        for side, rs in reports.items():
            for key in ("median_ttft_ms", "p90_ttft_ms", "output_throughput"):
                row[f"{side}_{key}"] = round(sum(r[key] for r in rs) / len(rs), 1)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    load.append(os.getloadavg()[0])
    print(f"`sf-trt serve` with `{args.ab_flag}` and without; load average {load[0]:.2f} before, {load[1]:.2f} after; "
          f"{args.repeats} loadtests each per concurrency, max(C, {args.min_requests}) requests of {args.max_tokens} tokens, greedy, prompt lookup")
    print("| C | median TTFT with / without (ms) | p90 TTFT with / without (ms) | output tok/s with / without |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrency']} | {r['with_median_ttft_ms']} / {r['without_median_ttft_ms']} | {r['with_p90_ttft_ms']} / {r['without_p90_ttft_ms']} "
              f"| {r['with_output_throughput']} / {r['without_output_throughput']} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "load": load, "settings": vars(args) | {"prompts": str(args.prompts), "json": str(args.json)}},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

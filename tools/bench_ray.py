"""`sf-trt serve --ray` with 1 and 2 replicas against the plain server, in one run.

For each server — the plain `sf-trt serve`, then `sf-trt serve --ray --replicas 1`,
then `--replicas 2` (each on its own local Ray cluster, started and stopped by the
command) — run `sf-trt loadtest` at each concurrency (greedy, seeded, the bench
prompts, every loadtest's own checks on) and record requests/s and output tokens/s.
Prints a table and the ratios that matter: Ray with one replica over the plain
server at concurrency 1 (the proxy's overhead), and two replicas over one.

    python tools/bench_ray.py --concurrency 1,8,32 --max-tokens 32 --json bench_ray.json

Replicas split the cores: with N replicas each gets `--threads cores // N` and
`--replica-cpus cores / N`. The servers run one after the other, so note the
machine's load (printed before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import ROOT, loadtest, start_server, stop_server  # noqa: E402


def servers(cores: int) -> list[tuple[str, list[str]]]:
    out = [("plain", [])]
    for n in (1, 2):
        out.append((f"ray x{n}", ["--ray", "--replicas", str(n), "--replica-cpus", f"{cores / n:g}", "--threads", str(max(1, cores // n))]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--lanes", type=int, default=8, help="--max-num-seqs of each server (each replica)")
    ap.add_argument("--prompts", type=Path, default=ROOT / "tools" / "prompts" / "bench.jsonl")
    ap.add_argument("--min-requests", type=int, default=8, help="requests per run: max(this, 2 x the concurrency)")
    ap.add_argument("--backend-flag", action="append", default=[], help="an extra flag for every server (repeatable), e.g. --backend-flag=--backend=fake")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    cores = len(os.sched_getaffinity(0))
    loads = [os.getloadavg()]
    rows: dict[str, dict[int, dict]] = {}
    for name, flags in servers(cores):
        proc, url = start_server(args.lanes, args.max_context, [*flags, *args.backend_flag])
        try:
            loadtest(url, argparse.Namespace(**{**vars(args), "min_requests": args.min_requests}), 1, "prompt-lookup")  # warm up
            rows[name] = {}
            for c in concurrencies:
                lt_args = argparse.Namespace(**{**vars(args), "min_requests": max(args.min_requests, 2 * c)})
                r = loadtest(url, lt_args, c, "prompt-lookup")
                rows[name][c] = {"req_s": round(r["request_throughput"], 3), "tok_s": round(r["output_throughput"], 2),
                                 "median_ttft_ms": round(r["median_ttft_ms"], 1), "requests": r["completed"]}
                print(json.dumps({"server": name, "concurrency": c, **rows[name][c]}), file=sys.stderr, flush=True)
        finally:
            stop_server(proc)
    loads.append(os.getloadavg())
    print(f"load average (1, 5, 15 min) before: {loads[0]}, after: {loads[1]}; {cores} cores")
    print("| server | " + " | ".join(f"C={c} req/s | C={c} tok/s" for c in concurrencies) + " |")
    print("|---|" + "---|---|" * len(concurrencies))
    for name, by_c in rows.items():
        print(f"| {name} | " + " | ".join(f"{by_c[c]['req_s']} | {by_c[c]['tok_s']}" for c in concurrencies) + " |")
    first = concurrencies[0]
    ratios = {
        f"ray x1 / plain tok/s at C={first} (the proxy's cost)": rows["ray x1"][first]["tok_s"] / rows["plain"][first]["tok_s"],
        f"ray x1 / plain median TTFT at C={first}": rows["ray x1"][first]["median_ttft_ms"] / rows["plain"][first]["median_ttft_ms"],
        **{f"ray x2 / ray x1 tok/s at C={c}": rows["ray x2"][c]["tok_s"] / rows["ray x1"][c]["tok_s"] for c in concurrencies},
    }
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ratios": ratios, "load": loads, "cores": cores,
                                         "settings": {k: str(v) for k, v in vars(args).items()}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`sf-trt serve --ray` with 1 and 2 replicas against the plain server, in one run.

Three servers run side by side — the plain `sf-trt serve`, `sf-trt serve --ray
--replicas 1` and `--replicas 2` (each Ray one on its own local cluster, started and
stopped by the command) — and, at each concurrency, `sf-trt loadtest` runs against
each in turn, `--repeats` rounds in rotating order, so a change in the machine's load
hits all three alike (greedy, seeded, the bench prompts, every loadtest's own checks
on). Reports the mean requests/s and output tokens/s, and the ratios that matter, per
round then averaged: Ray with one replica over the plain server at concurrency 1 (the
proxy's overhead), and two replicas over one.

    python tools/bench_ray.py --concurrency 1,8,32 --max-tokens 32 --repeats 2 --json bench_ray.json

Replicas split the cores: with N replicas each gets `--threads cores // N` and
`--replica-cpus cores / N`. Idle servers cost little, but not nothing (Ray's
processes); the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

from bench_serve import ROOT, loadtest, start_server, stop_server  # a sibling: the script's own folder is on sys.path


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
    ap.add_argument("--min-requests", type=int, default=8, help="requests per run: max(this, the concurrency)")
    ap.add_argument("--repeats", type=int, default=2, help="rounds per concurrency, the servers' order rotating")
    ap.add_argument("--backend-flag", action="append", default=[], help="an extra flag for every server (repeatable), e.g. --backend-flag=--backend=fake")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    cores = len(os.sched_getaffinity(0))
    loads = [os.getloadavg()]
    names = [name for name, _ in servers(cores)]
    runs: dict[str, dict[int, list[dict]]] = {name: {c: [] for c in concurrencies} for name in names}
    procs = {}
    try:
        for name, flags in servers(cores):
            procs[name] = start_server(args.lanes, args.max_context, [*flags, *args.backend_flag])
        for name in names:  # warm up
            loadtest(procs[name][1], args, 1, "prompt-lookup")
        for c in concurrencies:
            lt_args = copy.copy(args)
            lt_args.min_requests = max(args.min_requests, c)
            for rnd in range(args.repeats):
                for name in names[rnd % 3:] + names[: rnd % 3]:
                    r = loadtest(procs[name][1], lt_args, c, "prompt-lookup")
                    runs[name][c].append({"req_s": r["request_throughput"], "tok_s": r["output_throughput"],
                                          "median_ttft_ms": r["median_ttft_ms"], "requests": r["completed"]})
                    print(json.dumps({"server": name, "concurrency": c, "round": rnd, **runs[name][c][-1]}), file=sys.stderr, flush=True)
    finally:
        for proc, _ in procs.values():
            try:
                stop_server(proc)
            except SystemExit as exc:
                print(exc, file=sys.stderr)

    def mean(xs):
        return sum(xs) / len(xs)

    rows = {name: {c: {k: round(mean([r[k] for r in runs[name][c]]), 3) for k in ("req_s", "tok_s", "median_ttft_ms")}
                   for c in concurrencies} for name in names}

    def ratio(a: str, b: str, c: int, key: str = "tok_s") -> float:
        return mean([x[key] / y[key] for x, y in zip(runs[a][c], runs[b][c])])  # per round, then averaged

    loads.append(os.getloadavg())
    print(f"load average (1, 5, 15 min) before: {loads[0]}, after: {loads[1]}; {cores} cores")
    print("| server | " + " | ".join(f"C={c} req/s | C={c} tok/s" for c in concurrencies) + " |")
    print("|---|" + "---|---|" * len(concurrencies))
    for name, by_c in rows.items():
        print(f"| {name} | " + " | ".join(f"{by_c[c]['req_s']} | {by_c[c]['tok_s']}" for c in concurrencies) + " |")
    first = concurrencies[0]
    ratios = {
        f"ray x1 / plain tok/s at C={first} (the proxy's cost)": ratio("ray x1", "plain", first),
        f"ray x1 / plain median TTFT at C={first}": ratio("ray x1", "plain", first, "median_ttft_ms"),
        **{f"ray x2 / ray x1 tok/s at C={c}": ratio("ray x2", "ray x1", c) for c in concurrencies},
        **{f"ray x1 / plain tok/s at C={c}": ratio("ray x1", "plain", c) for c in concurrencies[1:]},
    }
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "runs": runs, "ratios": ratios, "load": loads, "cores": cores,
                                         "settings": {k: str(v) for k, v in vars(args).items()}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

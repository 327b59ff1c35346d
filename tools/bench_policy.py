"""Drafting policies side by side through the Generator (no HTTP): plain, drafting freely, load-aware.

For each lane count, max(8, lanes) requests of the bench prompts run under each policy,
in --rounds interleaved rounds (the order flips every round), and the medians are
printed as tok/s and relative to plain, with the draft tokens accepted / proposed, for
all requests and for each prompt kind (grounded, open: each request's tokens over its own
seconds).

    python tools/bench_policy.py --lanes 1,4,8,16 --max-tokens 64 --rounds 4 [--threads 2] [--json policy.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lanes", default="1,4,8,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--tick-tokens", type=int, default=8)
    ap.add_argument("--prompts", type=Path, default=ROOT / "tools" / "prompts" / "bench.jsonl")
    ap.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads (default: one per core)")
    ap.add_argument("--json", type=Path, default=None, help="also write the medians here")
    args = ap.parse_args(argv)

    from sf_trt.abi import SamplingParams
    from sf_trt.backends import BackendSpec
    from sf_trt.entrypoints.model import ModelSpec, resolve
    from sf_trt.generate import Generator, Request
    from sf_trt.scheduler import DraftPolicy, LoadAwareDrafting

    model = resolve(ModelSpec(weights="int8"))
    tok = model.tokenizer
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    ids = [tok.encode(tok.apply_chat_template(r["messages"])) if "messages" in r else tok.encode(r["prompt"]) for r in rows]
    report = []
    for lanes in [int(x) for x in args.lanes.split(",")]:
        prims = BackendSpec(threads=args.threads).open(model.model_dir.path, max_lanes=lanes, max_context=args.max_context)
        reqs = [Request(ids[i % len(ids)], params=SamplingParams(max_tokens=args.max_tokens), seed=i) for i in range(max(8, lanes))]
        gens = {name: Generator(prims, policy=policy, tick_tokens=args.tick_tokens)
                for name, policy in (("plain", None), ("free", DraftPolicy()), ("load-aware", LoadAwareDrafting()))}
        gens["plain"].run([dataclasses.replace(reqs[0], speculate=False, params=SamplingParams(max_tokens=4))])  # warm up
        kinds = [rows[i % len(rows)].get("kind", "all") for i in range(len(reqs))]
        speed = {(name, kind): [] for name in gens for kind in ("all", *sorted(set(kinds)))}
        drafts = {}
        for rnd in range(args.rounds):
            for name in (list(gens) if rnd % 2 == 0 else list(gens)[::-1]):
                t0 = time.perf_counter()
                res = gens[name].run([dataclasses.replace(r, speculate=name != "plain") for r in reqs])
                speed[name, "all"].append(sum(len(x.tokens) for x in res) / (time.perf_counter() - t0))
                for kind in set(kinds):  # each request's own tokens over its own seconds (one lane: end to end)
                    mine = [x for x, k in zip(res, kinds) if k == kind]
                    speed[name, kind].append(sum(len(x.tokens) for x in mine) / sum(x.seconds for x in mine))
                drafts[name] = f"{sum(x.accepted for x in res)}/{sum(x.proposed for x in res)}"
        med = {key: statistics.median(v) for key, v in speed.items()}
        for kind in ("all", *sorted(set(kinds))):
            print(f"lanes {lanes} {kind}: " + ", ".join(
                f"{n} {med[n, kind]:.1f} tok/s ({med[n, kind] / med['plain', kind]:.2f}x" + (f", drafts {drafts[n]})" if kind == "all" else ")")
                for n in gens) + f"; load {os.getloadavg()[0]:.2f}", flush=True)
        report.append({"lanes": lanes, "tokens_per_s": {f"{n}/{k}": round(v, 2) for (n, k), v in med.items()}, "drafts": drafts,
                       "load": round(os.getloadavg()[0], 2)})
        prims.close()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

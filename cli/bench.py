"""``sf-trt bench``: every prompt of a file plain and speculative, side by side."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from sf_trt.abi import SamplingParams

from .errors import CliError
from .flags import add_model_flags, add_sampling_flags, ranged, sampling
from .generate import generator, prompt_ids
from .launch import context_for, open_backend, resolve

__all__ = ["add_bench_parser", "bench"]


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="plain vs speculative on a prompts file, side by side",
                       description="Run every prompt plain and speculative with the same parameters; print tokens/s, "
                       "speedup, acceptance and whether the outputs are identical (exit 1 if any differ).")
    b.add_argument("--prompts", type=Path, required=True,
                   help='JSONL: {"id", "messages": [...] | "prompt": str | "prompt_ids": [...], "max_tokens"} per line')
    b.add_argument("--lanes", type=ranged(int, 1, 64, what="lanes in 1..64"), default=1, help="prompts run at once (default 1)")
    b.add_argument("--json", action="store_true", help="print the results as one JSON object")
    add_sampling_flags(b, None)
    add_model_flags(b)
    b.set_defaults(func=cmd_bench)


def _read_prompts(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise CliError(f"--prompts {path}: cannot read ({exc.strerror})") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CliError(f"{path}:{n}: not JSON ({exc.msg})") from None
        given = [k for k in ("messages", "prompt", "prompt_ids") if k in row]
        if not isinstance(row, dict) or len(given) != 1:
            raise CliError(f"{path}:{n}: expected an object with exactly one of messages, prompt, prompt_ids (got {sorted(row) if isinstance(row, dict) else type(row).__name__})")
        mt = row.get("max_tokens", 192)
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            raise CliError(f"{path}:{n}: max_tokens must be an int >= 1 (got {mt!r})")
        row.setdefault("id", f"line{n}")
        rows.append(row)
    if not rows:
        raise CliError(f"--prompts {path}: no prompts")
    return rows


def bench(args) -> dict:
    """Every prompt plain, then speculative, with the same parameters; the results."""
    from sf_trt.generate import Request

    rows = _read_prompts(args.prompts)
    model = resolve(args, progress=not args.json)
    tok = model.tokenizer
    mode, params = sampling(args)
    requests = []
    for row in rows:
        ids = prompt_ids(tok, prompt=row.get("prompt"), messages=row.get("messages"), ids=row.get("prompt_ids"))
        p = dataclasses.replace(params, max_tokens=args.max_tokens or row.get("max_tokens", 192))
        requests.append(Request(ids, mode, p, seed=args.seed))
    max_context = context_for(args.max_context, [len(r.prompt_ids) + r.params.max_tokens for r in requests])
    prims = open_backend(args, model, max_lanes=args.lanes, max_context=max_context)
    gen = generator(prims, args)
    gen.run([Request(requests[0].prompt_ids[:8], mode, SamplingParams(max_tokens=4), speculate=False)])  # warm up
    # Plain and speculative side by side, group by group of `lanes` prompts, so a
    # change in the machine's load hits both alike.
    runs = {"plain": ([], 0.0), "spec": ([], 0.0)}
    for lo in range(0, len(requests), args.lanes):
        group = requests[lo : lo + args.lanes]
        for label, speculate in (("plain", False), ("spec", True)):
            t0 = time.perf_counter()
            results = gen.run([dataclasses.replace(r, speculate=speculate) for r in group])
            done, secs = runs[label]
            runs[label] = (done + results, secs + time.perf_counter() - t0)
    out = []
    for row, req, plain, spec in zip(rows, requests, runs["plain"][0], runs["spec"][0]):
        out.append({
            "id": row["id"], "kind": row.get("kind"), "prompt_tokens": len(req.prompt_ids),
            "identical": plain.tokens == spec.tokens and plain.finish == spec.finish,
            "plain": {"tokens": len(plain.tokens), "tokens_per_s": round(plain.tokens_per_s, 2), "finish": plain.finish.name.lower()},
            "spec": {"tokens": len(spec.tokens), "tokens_per_s": round(spec.tokens_per_s, 2), "finish": spec.finish.name.lower(),
                     "proposed": spec.proposed, "accepted": spec.accepted, "passes": spec.passes},
        })
    total = {label: sum(len(r.tokens) for r in results) / secs for label, (results, secs) in runs.items()}
    return {
        "results": out,
        "throughput_tokens_per_s": {k: round(v, 2) for k, v in total.items()},
        "settings": {"lanes": args.lanes, "temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                     "seed": args.seed, "threads": args.threads, "max_draft": args.max_draft, "backend": args.backend,
                     "weights": args.weights, "max_context": max_context},
    }


def cmd_bench(args) -> int:
    report = bench(args)
    if args.json:
        print(json.dumps(report))
    else:
        head = f"{'id':<22} {'prompt':>6} {'plain tok/s':>11} {'spec tok/s':>10} {'speedup':>8} {'accepted':>12} {'identical':>9}"
        print(head)
        for r in report["results"]:
            p, s = r["plain"], r["spec"]
            speedup = s["tokens_per_s"] / p["tokens_per_s"] if p["tokens_per_s"] else 0.0
            print(f"{r['id']:<22} {r['prompt_tokens']:>6} {p['tokens_per_s']:>11.1f} {s['tokens_per_s']:>10.1f} {speedup:>7.2f}x "
                  f"{s['accepted']:>5}/{s['proposed']:<6} {'yes' if r['identical'] else 'NO':>9}")
        t = report["throughput_tokens_per_s"]
        print(f"throughput over all prompts ({args.lanes} lane(s)): plain {t['plain']:.1f} tok/s, spec {t['spec']:.1f} tok/s")
    bad = [r["id"] for r in report["results"] if not r["identical"]]
    if bad:
        print(f"sf-trt: speculative output differs from plain on {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0

"""sf_trt's own numbers as an outside harness sees them: cold and warm, small and large windows.

    python tools/bench_self.py [--model DIR] [--windows fit,8192] [--waits sleep,spin] [--threads 2]
                               [--long-tokens 1024] [--decode-tokens 64] [--rounds 2] [--check] [--json PATH]

``sf-trt bench`` warms its backend up and sizes the window to its prompts, so the figures in
docs/benchmarks.md are a warm backend's with a small window. A harness that opens the backend once
with a large window (the model's context, so that any prompt fits) and times its first requests
saw something else (issue 23: a 1k-token prefill 4.3-4.6 s against 1.56 s, 0.5 s to the first
token of a 40-token prompt). This tool measures both ways in one run. For every window of
``--windows`` (``fit``: what ``sf-trt bench`` would choose for these requests; a number: that many
positions) and every thread-wait policy of ``--waits``, a freshly opened backend (the default
model, int8, one lane, through ``sf_trt.backends.open_model`` and the Generator, as
``sf-trt generate`` runs it) times, in this order:

* ``short``: the time to the first token of a chat prompt (``story_lighthouse``, 46 tokens), the
  backend's first request (``cold``), then again (``warm``);
* ``long``: the same for ``--long-tokens`` prompt ids (the bench prompts' ids, repeated);
* ``decode``: ``--decode-tokens`` greedy tokens after the short prompt, the decode-only rate.

Each figure is wall seconds and the process's CPU seconds (all threads, the kernel's share
included: robust to other jobs on the cores, where wall time is not). Cases run in turns,
``--rounds`` times (the order reversed every other round), and the median round counts. It
prints a table and writes JSON (``--json``). ``--check`` exits 1 when a regression of the kinds
issue 23 found shows (:data:`CHECKS`: a backend's first request that costs more than the same
request warm, a decode that costs more in a larger window), naming the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Sequence

PROMPTS = Path(__file__).with_name("prompts") / "bench.jsonl"
SHORT_PROMPT_ID = "story_lighthouse"
WAITS = ("sleep", "spin")

CHECKS = {
    "cold_short": 2.0,
    "decode_window": 1.25,
}
"""Largest allowed ratios (CPU time), each a regression issue 23 would have caught:
``cold_short``: in each window, the short prompt's time to the first token as the backend's first
request over the same request warm (the KV cache in transparent huge pages made it 3-5x at 1280
positions and about 12x at 8192); ``decode_window``: decode CPU per token in the largest window
over the smallest (the key extent keeps a pass's cost to the positions it reads)."""


class Clock:
    """Wall and process CPU seconds since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> dict:
        return {"wall_s": time.perf_counter() - self.wall, "cpu_s": time.process_time() - self.cpu}


def main(argv: Sequence[str] | None = None) -> int:
    """Cold and warm times to the first token and decode rates, per window and wait policy."""
    args = _parser().parse_args(argv)
    waits = args.waits.split(",")
    if set(waits) - set(WAITS):
        raise SystemExit(f"bench_self: --waits {args.waits}: expected {' or '.join(WAITS)}, comma-separated")
    from sf_trt.export.pipeline import default_model_dir
    from sf_trt.formats.model_dir import ModelDir
    from sf_trt.tokenizer import Tokenizer

    path = args.model if args.model is not None else default_model_dir(progress=False)
    model = ModelDir.open(path)
    tok = Tokenizer.load(model.path)
    short, long_ids = _prompts(tok, args.prompts, args.long_tokens)
    need = max(len(short) + args.decode_tokens, len(long_ids) + 1)
    windows = [_window(w, need, model.max_positions) for w in args.windows.split(",")]
    cases = [(w, wait) for w in windows for wait in waits]
    rounds: dict[tuple[int, str], list[dict]] = {case: [] for case in cases}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for case in cases if r % 2 == 0 else cases[::-1]:
            rounds[case].append(measure(model.path, case[0], case[1] == "spin", args.threads, short, long_ids, args.decode_tokens))
            load.append(os.getloadavg()[0])
    rows = [{"window": w, "wait": wait, **_median(rounds[(w, wait)])} for w, wait in cases]
    failed = check(rows) if args.check else []
    report = {
        "tool": "tools/bench_self.py", "model": str(model.path), "weights": model.weights, "threads": args.threads,
        "short_prompt_tokens": len(short), "long_prompt_tokens": len(long_ids), "decode_tokens": args.decode_tokens,
        "rounds": args.rounds, "load": [round(x, 2) for x in load], "rows": rows, "checks": CHECKS if args.check else None,
        "failed": failed,
    }
    print_table(report)
    for line in failed:
        print(f"REGRESSION: {line}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 1 if failed else 0


def measure(model_dir, window: int, spin: bool, threads: int, short: list[int], long_ids: list[int], decode_tokens: int) -> dict:
    """One freshly opened backend: the short and long prompts cold then warm, then the decode."""
    from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
    from sf_trt.backends import open_model
    from sf_trt.generate import Generator, Request

    def request(ids: list[int], n: int) -> Request:
        return Request(ids, Sampling.GPU_GREEDY, SamplingParams(max_tokens=n, flags=SamplingFlag.IGNORE_EOS), speculate=False)

    clock = Clock()
    prims = open_model("onnxruntime", model_dir, max_lanes=1, max_context=window, threads=threads, spinning=spin)
    out = {"open": clock.read()}
    try:
        gen = Generator(prims)
        for name, ids in (("short", short), ("long", long_ids)):
            for when in ("cold", "warm"):
                clock = Clock()
                (res,) = gen.run([request(ids, 1)])
                out[f"{name}_{when}"] = {**clock.read(), "first_token_s": res.first_token_s}
        clock = Clock()
        (res,) = gen.run([request(short, decode_tokens)])
        spent = clock.read()
        first = out["short_warm"]  # the same prompt's prefill, warm, taken out of the decode
        tokens = len(res.tokens) - 1
        out["decode"] = {
            "tokens": tokens,
            "tokens_per_s": tokens / max(1e-9, res.seconds - res.first_token_s),
            "cpu_ms_per_token": 1e3 * max(0.0, spent["cpu_s"] - first["cpu_s"]) / max(1, tokens),
        }
    finally:
        prims.close()
    return out


def check(rows: list[dict]) -> list[str]:
    """The :data:`CHECKS` that fail, one line each: every row's cold start, and per wait policy the
    largest window's decode against the smallest's."""
    failed = []
    for r in rows:
        cold, warm = r["short_cold"]["cpu_s"], r["short_warm"]["cpu_s"]
        if warm > 0 and cold / warm > CHECKS["cold_short"]:
            failed.append(f"cold_short (window {r['window']}, {r['wait']}): {cold:.3f} s CPU to the first token of the short "
                          f"prompt as the first request against {warm:.3f} warm: {cold / warm:.2f}x, allowed {CHECKS['cold_short']}x")
    for wait in sorted({r["wait"] for r in rows}):
        mine = sorted((r for r in rows if r["wait"] == wait), key=lambda r: r["window"])
        small, large = mine[0]["decode"]["cpu_ms_per_token"], mine[-1]["decode"]["cpu_ms_per_token"]
        if len(mine) > 1 and small > 0 and large / small > CHECKS["decode_window"]:
            failed.append(f"decode_window ({wait}): {large:.3f} ms CPU per decoded token at window {mine[-1]['window']} against "
                          f"{small:.3f} at {mine[0]['window']}: {large / small:.2f}x, allowed {CHECKS['decode_window']}x")
    return failed


def print_table(report: dict) -> None:
    print(f"{report['model']} ({report['weights']}), {report['threads']} threads, short prompt {report['short_prompt_tokens']} "
          f"tokens, long {report['long_prompt_tokens']}, decode {report['decode_tokens']} tokens, median of {report['rounds']} "
          f"round(s); load {report['load'][0]} -> {report['load'][-1]}")
    head = ["window", "wait", "open s", "short cold s (cpu)", "short warm s (cpu)", "long cold s (cpu)", "long warm s (cpu)",
            "decode tok/s", "decode cpu ms/tok"]
    cells = []
    for r in report["rows"]:
        pair = lambda k: f"{r[k]['wall_s']:.3f} ({r[k]['cpu_s']:.3f})"  # noqa: E731
        cells.append([str(r["window"]), r["wait"], f"{r['open']['wall_s']:.2f}", pair("short_cold"), pair("short_warm"),
                      pair("long_cold"), pair("long_warm"), f"{r['decode']['tokens_per_s']:.1f}", f"{r['decode']['cpu_ms_per_token']:.2f}"])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths)))


def _median(runs: list[dict]) -> dict:
    """Each figure's median over the rounds."""
    return {k: {f: statistics.median(run[k][f] for run in runs) for f in runs[0][k]} for k in runs[0]}


def _prompts(tok, path: Path, long_tokens: int) -> tuple[list[int], list[int]]:
    """The short chat prompt's ids, and ``long_tokens`` ids: every bench prompt's, in turn, repeated."""
    lines = [json.loads(s) for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]
    encoded = {p["id"]: tok.encode_chat(p["messages"], add_generation_prompt=True) for p in lines}
    if SHORT_PROMPT_ID not in encoded:
        raise SystemExit(f"bench_self: {path} has no prompt {SHORT_PROMPT_ID!r} (ids: {', '.join(encoded)})")
    pool = [t for ids in encoded.values() for t in ids]
    return encoded[SHORT_PROMPT_ID], (pool * -(-long_tokens // len(pool)))[:long_tokens]


def _window(text: str, need: int, model_context: int) -> int:
    """``fit``: the multiple of 256 that holds ``need`` positions (as sf-trt sizes its window); else the number."""
    from sf_trt.cli.launch import context_window

    if text == "fit":
        return context_window(None, model_context, [("bench_self", need - 1, 1)])
    value = int(text)
    if not need <= value <= model_context:
        raise SystemExit(f"bench_self: --windows {value}: expected {need}..{model_context} positions (the requests' need .. the model's context)")
    return value


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python tools/bench_self.py", description=main.__doc__)
    ap.add_argument("--model", type=Path, help="a model directory (default: the default model, int8, exported into the cache)")
    ap.add_argument("--prompts", type=Path, default=PROMPTS, help=f"bench prompts (default {PROMPTS.name}; needs {SHORT_PROMPT_ID!r})")
    ap.add_argument("--windows", default="fit,8192", help="positions per lane, comma-separated: fit or a number (default fit,8192)")
    ap.add_argument("--waits", default=",".join(WAITS), help="onnxruntime's threads between ops: sleep, spin or both (default both)")
    ap.add_argument("--threads", type=_positive, default=2, help="onnxruntime intra-op threads (default 2)")
    ap.add_argument("--long-tokens", type=_positive, default=1024, help="the long prompt's tokens (default 1024)")
    ap.add_argument("--decode-tokens", type=_positive, default=64, help="greedy tokens of the decode (default 64)")
    ap.add_argument("--rounds", type=_positive, default=2, help="times every case runs, in turns (default 2; the median counts)")
    ap.add_argument("--check", action="store_true", help="exit 1 when a figure of CHECKS regresses (issue 23)")
    ap.add_argument("--json", type=Path, help="write the report here")
    return ap


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Weight formats side by side: the decoder pass of each export, passes interleaved, same rows.

    python tools/bench_weights.py [--weights int8,q4] [--model NAME=DIR ...] [--rows 1,9] [--threads 2] [--rounds 40]

Opens the default model (SmolLM2-135M-Instruct) exported with each of ``--weights`` (exported
into the cache once), and any ``--model NAME=DIR``, on onnxruntime's CPU kernels; then, round by
round, runs one pass of R rows of one lane (at position 256, the cache filled by a 256-token
prefill) on each model in turn, so a busy machine slows them alike. Prints per model and R the
median milliseconds per pass (wall, and the process's CPU time, which other jobs on the cores
disturb less) and the ratio to the first model. Run ``uptime`` beside it; read the ratios, not the
absolute times, on a shared machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default="int8,q4", help="the default model's exports to compare (comma-separated; '' for none)")
    ap.add_argument("--model", action="append", default=[], metavar="NAME=DIR", help="another model directory")
    ap.add_argument("--rows", default="1,9", help="rows per pass (comma-separated)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args(argv)

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.export.pipeline import default_model_dir
    from sf_trt.primitives import Rows

    dirs = {w: default_model_dir(weight_dtype=w) for w in args.weights.split(",") if w}
    for spec in args.model:
        name, _, path = spec.partition("=")
        dirs[name] = Path(path)
    rows_per_pass = [int(r) for r in args.rows.split(",")]
    prefill = 256
    models = {n: OrtDecoderPrimitives(d, max_lanes=1, max_context=prefill + max(rows_per_pass) + 8, threads=args.threads) for n, d in dirs.items()}
    rng = np.random.default_rng(0)
    ids = rng.integers(100, 1000, prefill + max(rows_per_pass))
    for p in models.values():
        p.forward(Rows(np.zeros(prefill, np.int64), np.arange(prefill), ids[:prefill], np.array([prefill - 1])))
    times = {(n, r): ([], []) for n in models for r in rows_per_pass}
    for _ in range(args.rounds):
        for r in rows_per_pass:
            rows = Rows(np.zeros(r, np.int64), np.arange(prefill, prefill + r), ids[prefill:prefill + r], np.arange(r))
            for n, p in models.items():
                w0, c0 = time.perf_counter(), time.process_time()
                p.forward(rows)
                times[n, r][0].append(time.perf_counter() - w0)
                times[n, r][1].append(time.process_time() - c0)
                p.truncate(0, prefill)
    first = next(iter(models))
    print(f"{'model':<14} {'rows':>4} {'ms/pass':>8} {'cpu ms':>7} {'vs ' + first:>10} {'cpu vs':>7}")
    for r in rows_per_pass:
        base_w, base_c = (float(np.median(x)) for x in times[first, r])
        for n in models:
            w, c = (float(np.median(x)) for x in times[n, r])
            print(f"{n:<14} {r:>4} {1e3 * w:>8.2f} {1e3 * c:>7.2f} {w / base_w:>9.2f}x {c / base_c:>6.2f}x")
    for p in models.values():
        p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The decoder pass on onnxruntime, alone: passes/s at R rows per pass and prefill time, per context size.

    python tools/bench_decoder.py [--model-dir DIR | --int8] [--contexts 512,2048] [--rows 1,9]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.backends.ort_session import OPTIMIZATION_LEVELS
from sf_trt.export.pipeline import default_model_dir
from sf_trt.primitives import Rows


def main(argv: Sequence[str] | None = None) -> None:
    """Passes/s of one lane at R rows per pass, and the prefill time, per context size."""
    ap = argparse.ArgumentParser(prog="python tools/bench_decoder.py", description=main.__doc__)
    ap.add_argument("--model-dir", help="an exported model directory (default: the default model, fetched and exported)")
    ap.add_argument("--int8", action="store_true", help="the default model with int8 weights")
    ap.add_argument("--contexts", default="512,2048", help="max_context values (comma-separated)")
    ap.add_argument("--rows", default="1,9", help="rows per decode pass (comma-separated)")
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--passes", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--optimization", default="all", choices=OPTIMIZATION_LEVELS)
    args = ap.parse_args(argv)
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        model_dir = default_model_dir(weight_dtype="int8" if args.int8 else "float32")
    print(f"model {model_dir}  load average {os.getloadavg()[0]:.2f}  (best / median of {args.passes} passes)")

    def rows(start: int, tokens: np.ndarray, all_logits: bool) -> Rows:
        n = tokens.shape[0]
        wanted = np.arange(n) if all_logits else np.array([n - 1])
        return Rows(np.zeros(n, np.int64), np.arange(start, start + n, dtype=np.int64), tokens.astype(np.int64), wanted.astype(np.int64))

    tokens = np.random.default_rng(0).integers(100, 10000, max(args.prefill, 64))
    for ctx in (int(c) for c in args.contexts.split(",")):
        with OrtDecoderPrimitives(model_dir, max_lanes=1, max_context=ctx, threads=args.threads, optimization=args.optimization) as p:
            start = min(args.prefill, ctx - 64)
            p.forward(rows(0, tokens[:8], False))
            p.truncate(0, 0)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                p.forward(rows(0, tokens[:start], False))
                times.append(time.perf_counter() - t0)
                p.truncate(0, 0)
            print(f"max_context {ctx}: prefill {start} rows {min(times):.3f} s ({start / min(times):.0f} rows/s)")
            p.forward(rows(0, tokens[:start], False))
            for r in (int(x) for x in args.rows.split(",")):
                times = []
                for _ in range(args.passes):
                    t0 = time.perf_counter()
                    p.forward(rows(start, tokens[:r], True))
                    times.append(time.perf_counter() - t0)
                    p.truncate(0, start)
                best, med = min(times), float(np.median(times))
                print(f"  R={r:<3d} {1 / best:6.1f} passes/s best, {1 / med:6.1f} median ({best * 1e3:.1f} / {med * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()

"""What one more row per lane costs a decoder pass: the number `sf-trt serve --spec-row-cost` models.

For B lanes of a 200-token history, times a forward pass with T rows per lane
(T = 1: plain decoding; T > 1: a draft of T - 1 tokens), every lane or every other
lane drafting (the decoder pads a pass to its longest lane, so both cost alike).
Configurations are interleaved over --reps rounds and medians reported, so a change
in the machine's load hits them alike. Prints, per B, each pass's time relative to
T = 1 and the cost of one row per lane in passes; --json writes them.

    python tools/bench_rows.py --lanes 1,4,8 --rows 2,3,5 --max-context 512
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lanes", default="1,4,8")
    ap.add_argument("--rows", default="2,3,5", help="rows per lane to compare with 1")
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--history", type=int, default=200)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--weights", default="int8")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.export.pipeline import default_model_dir
    from sf_trt.primitives import Rows

    lanes_list = [int(x) for x in args.lanes.split(",")]
    rows_list = [int(x) for x in args.rows.split(",")]
    prims = OrtDecoderPrimitives(default_model_dir(progress=False, weight_dtype=args.weights), max_lanes=max(lanes_list),
                                 max_context=args.max_context, threads=args.threads)
    h = args.history
    for lane in range(max(lanes_list)):
        prims.forward(Rows(np.full(h, lane), np.arange(h), np.arange(h) % 1000 + 10, np.zeros(0, np.int64)))

    def once(b: int, rows_of) -> float:
        lanes, positions = [], []
        for lane in range(b):
            r = rows_of(lane)
            lanes += [lane] * r
            positions += range(h, h + r)
        n = len(lanes)
        t0 = time.perf_counter()
        prims.forward(Rows(np.array(lanes), np.array(positions), np.full(n, 11), np.arange(n)))
        dt = time.perf_counter() - t0
        for lane in range(b):
            prims.truncate(lane, h)
        return dt

    configs = {(b, 1, "all"): (b, lambda _l: 1) for b in lanes_list}
    for b in lanes_list:
        for t in rows_list:
            configs[(b, t, "all")] = (b, lambda _l, t=t: t)
            if b > 1:
                configs[(b, t, "half")] = (b, lambda l, t=t: t if l % 2 == 0 else 1)
    times: dict = {k: [] for k in configs}
    for _ in range(args.reps):
        for key, (b, rows_of) in configs.items():
            times[key].append(once(b, rows_of))
    report = {"load": os.getloadavg()[0], "settings": {k: str(v) for k, v in vars(args).items()}, "lanes": {}}
    for b in lanes_list:
        base = statistics.median(times[(b, 1, "all")])
        rel = {f"T={t} {m}": round(statistics.median(times[(b, t, m)]) / base, 3) for (bb, t, m) in configs if bb == b and t > 1}
        per_row = {f"T={t}": round((statistics.median(times[(b, t, "all")]) / base - 1) / (t - 1), 3) for t in rows_list}
        report["lanes"][b] = {"one_row_ms": round(1000 * base, 2), "relative": rel, "row_cost": per_row}
        print(f"B={b}: one-row pass {1000 * base:.1f} ms; relative {rel}; one row per lane costs {per_row} passes")
    print(f"load {report['load']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    prims.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The verify-and-sample graph's cost per run at a model's vocabulary, on that model's own logits rows.

    python tools/bench_vocab.py MODEL_DIR [MODEL_DIR ...] [--prompt-ids 2,818,5279]

For each model directory: forwards the prompt (default: a 200-token ramp of ids below 1000)
through its decoder once and keeps every row's logits, then times ``OrtVerifySampler`` on those
rows as ``tools/bench_sampler.py --logits`` does (one thread, process CPU time, best of 7; greedy
and Gumbel with and without top-k / top-p, 1, 9 and 16 rows), and the RSS the sampler's sessions
add once opened. Run the models in one command to compare them side by side.
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main() -> None:
    from bench_sampler import time_runs  # a sibling: the script's own folder is on sys.path

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.primitives import Rows

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dirs", nargs="+", type=Path)
    p.add_argument("--prompt-ids", default=None)
    args = p.parse_args()
    out = {}
    for d in args.model_dirs:
        ids = np.asarray([int(t) for t in args.prompt_ids.split(",")] if args.prompt_ids else np.arange(2, 202) * 3 % 1000, np.int64)
        n = len(ids)
        with OrtDecoderPrimitives(d, max_lanes=1, max_context=max(256, n + 1), threads=2) as prims:
            logits = np.asarray(prims.forward(Rows(np.zeros(n, np.int64), np.arange(n, dtype=np.int64), ids, np.arange(n, dtype=np.int64))))
        before = rss_mb()
        times = time_runs(logits)
        out[d.name] = {"vocab": int(logits.shape[1]), "sampler_rss_mb": round(rss_mb() - before, 1), "ms": times}
        print(json.dumps({d.name: out[d.name]}), flush=True)
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()

"""What verify_sample's check of its logits rows costs, beside the sampler it guards.

    python tools/bench_row_check.py [--vocab 49152]

``PrimitivesBase.verify_sample`` reduces each logits row to its largest value to
find rows it cannot sample from (NaN, +inf, all -inf, overflow at the
temperature; see ``sf_trt.primitives.RowFault``). This times that reduction and
the onnxruntime sampler graph on the same rows, greedy and Gumbel, at 1, 9 and 36
rows (a lane; 4 lanes with 8-token drafts). Best of 30; the machine is shared:
read the ratios.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sf_trt.backends.ort_sampler import OrtVerifySampler
from sf_trt.primitives import Capabilities, PrimitivesBase, SampleRows


def best_of(fn, n: int = 30) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152, help="the vocabulary (default SmolLM2's, 49152)")
    vocab = ap.parse_args().vocab
    sampler = OrtVerifySampler(vocab, top_k_limit=min(1024, vocab))
    caps = Capabilities(vocab=vocab, eos=0, max_lanes=1, max_context=2, max_rows_per_pass=64, verify_rows=True, truncate_partial=True)
    seam = PrimitivesBase(caps)
    rng = np.random.default_rng(0)
    for k in (1, 9, 36):
        logits = (rng.standard_normal((k, vocab)) * 5).astype(np.float32)
        for mode, name in ((0, "greedy"), (1, "gumbel")):
            sample = SampleRows(
                np.full(k, mode, np.int64), np.full(k, 0.8, np.float32), np.ones(k, np.float32), np.zeros(k, np.int64),
                np.zeros(k, np.int64), np.arange(1, k + 1, dtype=np.int64), np.full(k, -1, np.int64),
            )
            t_sampler = best_of(lambda: sampler.run(logits, sample))
            t_check = best_of(lambda: seam.row_faults(logits, sample))
            print(f"rows {k:2d} {name}: sampler {t_sampler * 1e3:7.3f} ms, row check {t_check * 1e3:.3f} ms ({t_check / t_sampler:.1%})")


if __name__ == "__main__":
    main()

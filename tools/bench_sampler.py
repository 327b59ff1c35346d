"""What one verify-and-sample run costs on real logits rows, and how wide their top-p nuclei are.

    python tools/bench_sampler.py --capture logits.npy [--max-tokens 48] [--threads 2]
    python tools/bench_sampler.py --logits logits.npy [--json]
    python tools/bench_sampler.py --row-check [--vocab 49152]

``--capture`` decodes each prompt of ``tools/prompts/bench.jsonl`` (temperature 0.8, top-p 0.95,
seed 1, the CLI's default model) and saves every logits row the sampler was given, float32
``[N, vocab]``. ``--logits`` times one ``OrtVerifySampler.run`` (one thread, process CPU time,
best of 7 x 20 calls at 1 row, 7 x 5 above) on rows 37.. of such a file, greedy and Gumbel with
and without filters, at 1, 9 and 16 rows, and prints the nuclei's sizes at temperature 0.8,
top-p 0.95 and how many rows 64 ... 512 candidates leave uncovered. It uses only
``OrtVerifySampler`` and ``SampleRows``, so an older checkout can be timed with this file
(``PYTHONPATH=<checkout> python tools/bench_sampler.py ...``); run checkouts alternately.

``--row-check`` times what ``PrimitivesBase.verify_sample``'s check of its logits rows
costs beside the sampler it guards: each row reduced to its largest value to find rows it
cannot sample from (NaN, +inf, all -inf, overflow at the temperature; see
``sf_trt.primitives.RowFault``), and the sampler graph on the same random rows, greedy and
Gumbel, at 1, 9 and 36 rows (a lane; 4 lanes with 8-token drafts). Best of 30; the machine
is shared: read the ratios.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

PROMPTS = Path(__file__).with_name("prompts") / "bench.jsonl"
CASES = {
    "greedy": dict(mode=0),
    "Gumbel": {},
    "Gumbel, top-k 50": dict(top_k=50),
    "Gumbel, top-p 0.95": dict(top_p=0.95),
    "Gumbel, top-p 0.9, top-k 50": dict(top_p=0.9, top_k=50),
}


def capture(path: Path, max_tokens: int, threads: int) -> None:
    """Decode every bench prompt sampled and save the logits rows the sampler was given."""
    import sf_trt

    llm = sf_trt.LLM(threads=threads, max_context=1024, max_num_seqs=1, speculate="none")
    params = sf_trt.SamplingParams(temperature=0.8, top_p=0.95, max_tokens=max_tokens, flags=sf_trt.SamplingFlag.IGNORE_EOS)
    rows_seen = []

    def recorder(run):
        def keep_rows(logits, sample):
            rows_seen.append(np.array(logits, np.float32))
            return run(logits, sample)
        return keep_rows

    llm.primitives.instrument(sampler_run=recorder)
    for line in PROMPTS.read_text().splitlines():
        if line.strip():
            llm.chat(json.loads(line)["messages"], params, seed=1)
    llm.close()
    np.save(path, np.concatenate(rows_seen))
    print(f"{sum(len(r) for r in rows_seen)} rows saved to {path}")


def nuclei(logits: np.ndarray, temperature: float = 0.8, top_p: float = 0.95) -> dict:
    """The nucleus sizes of the rows and the share of rows that C candidates do not cover."""
    s = -np.sort(-logits.astype(np.float64) / temperature, axis=1)
    e = np.exp(s - s[:, :1])
    sizes = (np.cumsum(e, axis=1) < top_p * e.sum(axis=1, keepdims=True)).sum(axis=1) + 1
    out = {f"nucleus p{q}": int(np.percentile(sizes, q)) for q in (50, 90, 99, 100)}
    out.update({f"uncovered by {c}": round(float((sizes >= c).mean()), 4) for c in (64, 128, 256, 512)})
    return out


def time_runs(logits: np.ndarray) -> dict:
    from sf_trt.backends.ort_sampler import OrtVerifySampler
    from sf_trt.primitives import SampleRows

    vocab = logits.shape[1]
    sampler = OrtVerifySampler(vocab, min(1024, vocab), threads=1)
    out = {}
    for rows in (1, 9, 16):
        x = np.ascontiguousarray(logits[37 : 37 + rows])
        for name, kw in CASES.items():
            sample = SampleRows(
                mode=np.full(rows, kw.get("mode", 1), np.int64), temperature=np.full(rows, 0.8, np.float32),
                top_p=np.full(rows, kw.get("top_p", 1.0), np.float32), top_k=np.full(rows, kw.get("top_k", 0), np.int64),
                rng_counter_base=np.arange(rows, dtype=np.int64) + 11, position=np.arange(rows, dtype=np.int64) + 100,
                draft=np.full(rows, -1, np.int64), min_p=np.zeros(rows, np.float32),
            )
            sampler.run(x, sample)
            calls, best = (20 if rows == 1 else 5), np.inf
            for _ in range(7):
                t0 = time.process_time()
                for _ in range(calls):
                    sampler.run(x, sample)
                best = min(best, (time.process_time() - t0) / calls)
            out[f"{rows} rows, {name}"] = round(1e3 * best, 3)
    return out


def best_of(fn, n: int = 30) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def row_check(vocab: int) -> None:
    """The row check's cost beside the sampler's (module docstring, ``--row-check``)."""
    from sf_trt.backends.ort_sampler import OrtVerifySampler
    from sf_trt.primitives import Capabilities, PrimitivesBase, SampleRows

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


def main() -> None:
    ap = argparse.ArgumentParser(prog="python tools/bench_sampler.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, help="decode the bench prompts and save their logits rows here (.npy)")
    ap.add_argument("--logits", type=Path, help="time the sampler on the logits rows of this .npy")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens per prompt for --capture (default 48)")
    ap.add_argument("--threads", type=int, default=2, help="decoder threads for --capture (default 2)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--row-check", action="store_true", help="time verify_sample's row check beside the sampler")
    ap.add_argument("--vocab", type=int, default=49152, help="the vocabulary of --row-check's rows (default SmolLM2's, 49152)")
    args = ap.parse_args()
    if args.row_check:
        row_check(args.vocab)
        return
    if args.capture is None and args.logits is None:
        ap.error("give --capture PATH, --logits PATH or --row-check")
    if args.capture is not None:
        capture(args.capture, args.max_tokens, args.threads)
    if args.logits is not None:
        logits = np.load(args.logits)
        out = {"ms per run": time_runs(logits), "nuclei": nuclei(logits)}
        if args.json:
            print(json.dumps(out))
        else:
            for group, values in out.items():
                print(group)
                for k, v in values.items():
                    print(f"  {k}: {v}")


if __name__ == "__main__":
    main()

"""onnxruntime's fused ops in the decoder pass (``sf_trt.graphs.ort_fusions``, ``sf_trt.graphs.ort_attention``) against the graph without them, side by side.

    python tools/bench_fusions.py [--model DIR] [--weights int8] [--threads 2] [--spinning] [--rounds 40]
                                  [--variants unfused,rotary,skip_norm,fused,attention,runtime] [--cases decode@200,...] [--ops]

From the default model's directory (exported if need be; ``--model``: another model directory),
its ``decoder.onnx`` made into the pass form without fusions (``decoder_pass.onnx`` as written),
with each fusion alone, with both (``fused``), with the attention as ONNX ``Attention``
(``attention``), and with all of them (``runtime``: what onnxruntime's CPU backend runs now,
``sf_trt.backends.ort_decoder.loaded_graph``). Each variant is written into
the model directory for the run (beside its weights, which it shares) and removed after, and opened
as the backend opens the decoder (its threads, thread-wait policy and int8 setting). In one process,
round by round, each variant runs a few passes of every case in turn, so a change of load hits all
alike. Cases: one row at position 200 and at 1000 (decoding), a verify pass of 9 rows at 200, 8
lanes of one row at 200, and prefills of 512 rows at 0 and of 496 rows at 0 and after 3584 cached
positions (the 1st and 8th turns of bench_prefix_cache's 4k conversation; not run unless named in
``--cases``); the caches hold random keys and values up to the key extent (the position
rounded up to 64, as the backend binds them). A decoding case scores every row; a prefill computes
no logits (as the executor prefills: the prompt's last token is the first decode step's). Prints,
per case, each variant's best and median ms per pass and its ratio to the unfused graph's (above
1: faster), with the load average.

``--ops`` then profiles each case and variant once more with onnxruntime's profiler: kernel ms
per pass, the ms and GFLOP/s of the attention (``Attention``: ``4 * rows * keys * heads * head_dim``
a layer, the keys up to the extent) and of the weight matmuls (``MatMulNBits``, and ``MatMul``
where the attention is ``Attention``: ``2 * rows * weights``), beside numpy's float32 SGEMM rate
on this machine: where a pass's time goes, and how near each kind of arithmetic runs to what
the CPU does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ort_ops import kernel_us_by_op  # noqa: E402

VARIANTS = {"unfused": (None, False), "rotary": (dict(skip_norm=False), False), "skip_norm": (dict(rotary=False), False),
            "fused": ({}, False), "attention": (None, True), "runtime": ({}, True)}
"""Variant name -> (``onnxruntime_fused`` keywords or None: no fusion, whether ``exact_attention`` rewrites it)."""
DEFAULT_VARIANTS = ("unfused", "fused", "runtime")
CASES = {"decode@200": (1, 1, 200), "decode@1000": (1, 1, 1000), "verify9@200": (1, 9, 200), "lanes8@200": (8, 1, 200),
         "prefill512@0": (1, 512, 0), "prefill496@0": (1, 496, 0), "prefill496@3584": (1, 496, 3584)}
"""Case -> (lanes, rows per lane, first position)."""
DEFAULT_CASES = ("decode@200", "decode@1000", "verify9@200", "lanes8@200")
PASSES_PER_TURN = 5
PREFILL_ROWS = 64
"""A case of at least this many rows a lane is a prefill: no logits, a few rounds of one pass."""


def main(argv: Sequence[str] | None = None) -> None:
    """Time the decoder pass with and without onnxruntime's fused ops, alternating."""
    ap = argparse.ArgumentParser(prog="python tools/bench_fusions.py", description=main.__doc__)
    ap.add_argument("--model", type=Path, help="a model directory (default: the default model's, exported with --weights)")
    ap.add_argument("--weights", default="int8", choices=("float32", "int8", "q4"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--spinning", action="store_true", help="onnxruntime's threads spin between ops (default: they sleep, the backend's default)")
    ap.add_argument("--rounds", type=int, default=40, help=f"rounds; each runs {PASSES_PER_TURN} passes of every variant per case")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS) + " (default %(default)s)")
    ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help="comma-separated, of: " + ", ".join(CASES) + " (default %(default)s)")
    ap.add_argument("--ops", action="store_true", help="also profile each case and variant: kernel time per op type, the attention's and the weight matmuls' GFLOP/s")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    cases = args.cases.split(",")
    for name, known in (*((v, VARIANTS) for v in variants), *((c, CASES) for c in cases)):
        if name not in known:
            ap.error(f"{name!r} unknown (known: {', '.join(known)})")

    from sf_trt.export.pipeline import default_model_dir

    model_dir = args.model or default_model_dir(progress=False, weight_dtype=args.weights)
    files = _write_variants(model_dir, variants)
    try:
        _run(args, model_dir, files, cases)
    finally:
        for path in files.values():
            path.unlink(missing_ok=True)


def _write_variants(model_dir: Path, variants: list[str]) -> dict[str, Path]:
    import onnx

    from sf_trt.export.decoder_graph import pass_form
    from sf_trt.formats.model_dir import GRAPH_FILE
    from sf_trt.graphs.ort_attention import exact_attention
    from sf_trt.graphs.ort_fusions import onnxruntime_fused

    unfused = pass_form(onnx.load(str(model_dir / GRAPH_FILE), load_external_data=False))
    files = {}
    for name in variants:
        files[name] = model_dir / f".bench_fusions_{name}.onnx"
        fusions, attention = VARIANTS[name]
        graph = unfused if fusions is None else onnxruntime_fused(unfused, **fusions)
        onnx.save_model(exact_attention(graph) if attention else graph, str(files[name]))
    return files


def _run(args, model_dir: Path, files: dict[str, Path], cases: list[str]) -> None:
    from sf_trt.backends.ort_session import open_session
    from sf_trt.formats.model_dir import ModelDir

    model = ModelDir.open(model_dir)
    cfg = model.config
    config = {"session.intra_op.allow_spinning": "1" if args.spinning else "0"}
    if model.weights == "int8":
        config["session.qdq_matmulnbits_accuracy_level"] = "4"  # as the backend opens an int8 decoder
    sessions = {name: open_session(path, threads=args.threads, config=config) for name, path in files.items()}
    feeds_by_case = {case: _feeds(cfg, *CASES[case], np.random.default_rng(0)) for case in cases}
    print(f"{model_dir.name}: {args.threads} threads, {'spinning' if args.spinning else 'sleeping'}, {args.rounds} rounds of "
          f"{PASSES_PER_TURN} passes per variant and case; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    names = list(sessions)
    print("| case | " + " | ".join(f"{n}: best / median ms" for n in names) + " | " + " | ".join(f"{n} / unfused (median)" for n in names[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for case in cases:
        lanes, t, first = CASES[case]
        feeds = feeds_by_case[case]
        times: dict[str, list[float]] = {n: [] for n in names}
        for n in names:  # warm up
            sessions[n].run(["logits"], feeds)
        for r in range(args.rounds if t < PREFILL_ROWS else max(2, args.rounds // 20)):  # prefills: a few rounds of one pass
            for n in (names if r % 2 == 0 else names[::-1]):
                for _ in range(PASSES_PER_TURN if t < PREFILL_ROWS else 1):
                    t0 = time.perf_counter()
                    sessions[n].run(["logits"], feeds)
                    times[n].append(time.perf_counter() - t0)
        best = {n: 1e3 * min(v) for n, v in times.items()}
        med = {n: 1e3 * float(np.median(v)) for n, v in times.items()}
        base = names[0]
        print(f"| {case} | " + " | ".join(f"{best[n]:.2f} / {med[n]:.2f}" for n in names) + " | "
              + " | ".join(f"{med[base] / med[n]:.3f}x" for n in names[1:]) + " |", flush=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.ops:
        del sessions
        _ops(args, cfg, config, files, cases, feeds_by_case)


def _feeds(cfg, lanes: int, t: int, first: int, rng) -> dict:
    """A pass of ``t`` rows a lane at positions ``first...``, the caches random up to the key extent."""
    from sf_trt.formats.model_dir import cache_names

    extent = -(-(first + t) // 64) * 64
    feeds = {"input_ids": rng.integers(100, 10000, (lanes, t)), "positions": np.broadcast_to(first + np.arange(t), (lanes, t)).copy(),
             "logit_index": np.arange(lanes * t if t < PREFILL_ROWS else 0, dtype=np.int64)}
    for i in range(cfg.n_layers):
        for name in cache_names(i):
            feeds[name] = rng.standard_normal((lanes, cfg.n_kv_heads, extent, cfg.head_dim), np.float32)
    return feeds


def _ops(args, cfg, config: dict, files: dict[str, Path], cases: list[str], feeds_by_case: dict) -> None:
    """Each case and variant under onnxruntime's profiler (module docstring, ``--ops``)."""
    import tempfile

    from sf_trt.backends.ort_session import open_session

    a = np.ones((2048, 2048), np.float32)
    a @ a
    t0 = time.perf_counter()
    for _ in range(3):
        a @ a
    sgemm = 3 * 2 * 2048**3 / (time.perf_counter() - t0) / 1e9
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    weights = cfg.n_layers * (cfg.hidden * (q + 2 * kv) + q * cfg.hidden + 3 * cfg.hidden * cfg.ffn)
    print(f"\nonnxruntime's profile, one more run per case and variant; numpy's float32 SGEMM (2048^3) here: {sgemm:.0f} GFLOP/s")
    print("| case | variant | kernel ms / pass | attention ms (GFLOP/s) | weight matmuls ms (GFLOP/s) | largest other ops (ms) |\n|---|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            lanes, t, first = CASES[case]
            extent = -(-(first + t) // 64) * 64
            passes = PASSES_PER_TURN if t < PREFILL_ROWS else 1
            feeds = feeds_by_case[case]
            rows = lanes * t
            flops = {"attention": 4 * rows * extent * cfg.n_heads * cfg.head_dim * cfg.n_layers,
                     "weights": 2 * rows * weights + 2 * feeds["logit_index"].size * cfg.hidden * cfg.vocab}
            for name, path in files.items():
                session = open_session(path, threads=args.threads, config=config, profile_prefix=str(Path(tmp) / f"{name}_{case}"))
                for _ in range(1 + passes):  # the first warms up, left out
                    session.run(["logits"], feeds)
                us = kernel_us_by_op(Path(session.end_profiling()), skip_runs=1)
                fused = "Attention" in us
                groups = {"attention": ["Attention"] if fused else [], "weights": ["MatMulNBits", *(["MatMul"] if fused else [])]}
                ms = {g: sum(us[op] for op in ops) / passes / 1e3 for g, ops in groups.items()}
                cells = [f"{ms[g]:.1f} ({flops[g] / (ms[g] / 1e3) / 1e9:.0f})" if ms[g] else "-" for g in ("attention", "weights")]
                grouped = {op for ops in groups.values() for op in ops}
                others = ", ".join([f"{op} {v / passes / 1e3:.1f}" for op, v in us.most_common() if op not in grouped][:4])
                print(f"| {case} | {name} | {sum(us.values()) / passes / 1e3:.1f} | {cells[0]} | {cells[1]} | {others} |", flush=True)


if __name__ == "__main__":
    main()

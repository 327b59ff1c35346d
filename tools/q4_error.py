#!/usr/bin/env python3
"""How far ``--weights q4`` (or ``int4``) holds each layer matrix of a GGUF from the GGUF's own values.

    python tools/q4_error.py MODEL.gguf [--weights q4|int4] [--layers N] [--json OUT]

The q4 export carries Q4_0, Q4_1 and Q4_K blocks into ``MatMulNBits`` as they are (their error is
float32 rounding of the offsets, ~1e-7 of the weights), and requantizes every other matrix (Q5_0,
Q5_1, Q5_K, Q6_K, Q8_0, F16, F32) to 4 bits per block of 32 with a uint8 zero point
(``sf_trt.export.quantize.requantize_4bit``). Per GGUF type this prints how many matrices, whether
they are carried, and the error of the values the graph computes with against the GGUF's
dequantized values: the largest absolute error, the RMS error, and the RMS error relative to the
weights' RMS. ``--weights int4``: as the int4 export holds them, every matrix requantized, the
4-bit blocks too. ``--layers N``: the first N layers only (a quicker look at a large model).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--weights", choices=("q4", "int4"), default="q4", help="the export whose values to measure (default q4)")
    ap.add_argument("--layers", type=int, default=None, help="the first N layers only (default: all)")
    ap.add_argument("--json", type=Path, default=None, help="also write the per-type summary here")
    args = ap.parse_args(argv)

    from sf_trt.export.families import GGUF_LAYER_NAMES, family
    from sf_trt.export.gguf_llama import load_gguf, open_reader
    from sf_trt.export.quantize import requantization_error

    reader = open_reader(args.gguf)
    cfg, weights = load_gguf(reader, lazy=True)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    fam = family(cfg.arch)
    by_type: dict[str, dict] = {}
    for key, (carried, worst, rms, rms_w) in requantization_error(weights, args.layers, args.weights).items():
        _, i, field = key.split(".")
        kind = types.get(f"blk.{i}.{GGUF_LAYER_NAMES[fam.source_of(field)]}", "?")
        row = by_type.setdefault(kind, {"matrices": 0, "carried": carried, "max_abs": 0.0, "sq_err": 0.0, "sq_w": 0.0})
        row["matrices"] += 1
        row["max_abs"] = max(row["max_abs"], worst)
        row["sq_err"] += rms * rms
        row["sq_w"] += rms_w * rms_w
    print(f"{args.gguf.name}: layer matrices as --weights {args.weights} holds them, against the GGUF's values")
    print(f"{'GGUF type':<9} {'matrices':>8} {'held as':<12} {'max abs err':>12} {'RMS err':>10} {'RMS err / RMS w':>16}")
    summary = {}
    for kind, r in sorted(by_type.items()):
        rms, rel = (r["sq_err"] / r["matrices"]) ** 0.5, (r["sq_err"] / r["sq_w"]) ** 0.5 if r["sq_w"] else 0.0
        held = "carried" if r["carried"] else "requantized"
        print(f"{kind:<9} {r['matrices']:>8} {held:<12} {r['max_abs']:>12.3g} {rms:>10.3g} {rel:>16.4f}")
        summary[kind] = {"matrices": r["matrices"], "held": held, "max_abs": r["max_abs"], "rms": rms, "relative_rms": rel}
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

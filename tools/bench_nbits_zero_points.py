"""onnxruntime's ``MatMulNBits`` with each kind of zero point: speed, and whether a row is the same alone and in a pass of 9.

    python tools/bench_nbits_zero_points.py [--k 2048] [--n 5632] [--threads 2] [--json out.json]

Why it matters: a GGUF's Q4_1 / Q4_K blocks store a float offset per block (``w = d * q - m``).
``MatMulNBits`` takes a non-integer offset only as a float zero point, so the export carries the
offsets as a separate float32 ``MatMul`` of the block sums (``export/quantize.py``): 113 MB of a
1.1B Q4_K_M model's 921 MB read per token, and its peak RSS (docs/benchmarks.md). This checks
whether the onnxruntime installed here runs float zero points on its fast int8-compute path
(``accuracy_level`` 4) and keeps rows exact, which would let the export drop that ``MatMul``.
One random 4-bit matrix ``[n, k]`` in blocks of 32, three ways: no zero points, uint8 zero points,
float zero points; per way the ms of a 1-row and a 9-row pass (mean of ``--passes``), and whether
row 0 of the 9-row pass equals the same row alone, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np

BLOCK = 32
WAYS = ("none", "uint8", "float")


def graph(k: int, n: int, zero_points: np.ndarray | None, rng) -> bytes:
    """A one-node model: ``y = x @ W.T`` by ``MatMulNBits`` (4 bits, blocks of 32, ``accuracy_level`` 4)."""
    from onnx import TensorProto, helper, numpy_helper

    q = rng.integers(0, 16, (n, k // BLOCK, BLOCK), dtype=np.uint8)
    inits = [numpy_helper.from_array((q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8), "w"),
             numpy_helper.from_array(rng.random(n * (k // BLOCK), dtype=np.float32) * 0.01, "s")]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "z"))
    node = helper.make_node("MatMulNBits", ["x", *(i.name for i in inits)], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=4)
    g = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def measure(k: int, n: int, threads: int, passes: int) -> dict[str, dict]:
    """Each way's ms per pass (1 row, 9 rows) and row exactness."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    nb = k // BLOCK
    zero_points = {"none": None, "uint8": np.full((n, (nb + 1) // 2), 0x88, np.uint8),
                   "float": (rng.random(n * nb, dtype=np.float32) * 8).astype(np.float32)}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    x9 = rng.standard_normal((9, k), dtype=np.float32)
    out = {}
    for way in WAYS:
        session = ort.InferenceSession(graph(k, n, zero_points[way], rng), opts, providers=["CPUExecutionProvider"])
        row = {}
        for m in (1, 9):
            feed = {"x": x9[:m]}
            session.run(None, feed)
            t0 = time.perf_counter()
            for _ in range(passes):
                session.run(None, feed)
            row[f"ms_{m}_rows"] = 1e3 * (time.perf_counter() - t0) / passes
        row["row_exact"] = bool(np.array_equal(session.run(None, {"x": x9})[0][:1], session.run(None, {"x": x9[:1]})[0]))
        out[way] = row
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/bench_nbits_zero_points.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=2048, help="inputs (a multiple of 32; default: TinyLlama's hidden size)")
    ap.add_argument("--n", type=int, default=5632, help="outputs (default: TinyLlama's FFN size)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=50)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.k % BLOCK:
        ap.error(f"--k {args.k}: not a multiple of the block, {BLOCK}")
    import onnxruntime as ort

    rows = measure(args.k, args.n, args.threads, args.passes)
    print(f"onnxruntime {ort.__version__}, MatMulNBits 4 bits [{args.n}, {args.k}], blocks of {BLOCK}, accuracy_level 4, {args.threads} threads")
    print("| zero points | 1 row (ms) | 9 rows (ms) | row 0 of 9 == alone | 1 row / without |\n|---|---:|---:|---|---:|")
    for way, r in rows.items():
        print(f"| {way} | {r['ms_1_rows']:.3f} | {r['ms_9_rows']:.3f} | {'yes' if r['row_exact'] else 'NO'} | {r['ms_1_rows'] / rows['none']['ms_1_rows']:.1f}x |")
    if args.json:
        args.json.write_text(json.dumps({"onnxruntime": ort.__version__, "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                         "ways": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

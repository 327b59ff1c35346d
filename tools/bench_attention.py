"""The decoder pass's attention on onnxruntime, this checkout against another, side by side in one run.

    python tools/bench_attention.py --before /work/main [--weights int8] [--rounds 2] [--json out.json]

Each side runs in its own process (the other checkout's ``sf_trt`` and ``export`` first on the
import path, its own model cache: ``--before-cache``, made on first use from this cache's GGUF) and
times, on the real model at ``--window`` positions: decoding one lane at about 1k positions, eight
lanes at about 512, and prefills of 256, 1k and 4k tokens in chunks of 512 rows, as the executor
prefills (one lane, one request after another in the same backend). Every side's logits are hashed: the table says whether both sides computed the
same bits. Rounds alternate the sides' order; read the ratios, and the CPU seconds where the
machine is loaded (the load average is printed with each run).

``--passes`` compares the two decoder graphs alone, in one process, pass by pass alternating
(so a change of load hits both alike): the other checkout's ``decoder_pass.onnx`` (from
``--before-cache``) over caches bound at the whole window, as its backend binds them, and this
checkout's over caches bound at the key extent, the same cache contents in both: per case the
best and median pass, their ratio, and whether the logits' bits are equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ort_ops import kernel_us_by_op  # noqa: E402

DECODE_1 = (1000, 96)
"""One lane: prompt length, then decode steps (crossing position 1024: the arrays grow once)."""
DECODE_8 = (8, 500, 48)
"""Lanes, each one's prompt length, then decode steps of one row per lane (crossing 512)."""
PREFILLS = (256, 1024, 4096)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/bench_attention.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="another checkout (its sf_trt/ and export/) to run beside this one")
    ap.add_argument("--before-cache", default="/tmp/sf_trt_before_cache",
                    help="the other checkout's model cache (its model directory format may differ; default %(default)s)")
    ap.add_argument("--weights", default="int8", choices=("float32", "int8", "q4"))
    ap.add_argument("--window", type=int, default=8192, help="max_context of every backend (default %(default)s)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=1, help="rounds; each runs both sides, alternating which goes first")
    ap.add_argument("--json", help="write every run's figures here")
    ap.add_argument("--passes", type=int, default=0, metavar="N",
                    help="compare the two decoder graphs pass by pass, N passes of each per case (no end-to-end runs)")
    ap.add_argument("--cases", default="", help="--passes: only the cases whose name contains one of these (comma-separated)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.root, args.weights, args.window, args.threads)))
        return 0
    if args.passes:
        return _compare_graphs(args)
    sides = {"after": (None, os.environ.get("SF_TRT_CACHE"))}
    if args.before:
        sides["before"] = (str(Path(args.before).resolve()), args.before_cache)
    runs = []
    for r in range(args.rounds):
        order = list(sides) if r % 2 else list(sides)[::-1]
        for side in order:
            root, cache = sides[side]
            runs.append({"side": side, "round": r, "load": os.getloadavg()[0], **_spawn(root, cache, args)})
            print(f"round {r} {side}: load {runs[-1]['load']:.2f}", file=sys.stderr, flush=True)
    _table(runs)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
    hashes = {side: {r["hash"] for r in runs if r["side"] == side} for side in sides}
    if len(set().union(*hashes.values())) != 1:
        print(f"NOT BIT-IDENTICAL: logits hashes per side {hashes}")
        return 1
    return 0


def _spawn(root: str | None, cache: str | None, args) -> dict:
    env = dict(os.environ)
    if root:
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        Path(cache).mkdir(parents=True, exist_ok=True)
        here = Path(os.environ.get("SF_TRT_CACHE") or Path.home() / ".cache" / "sf_trt") / "gguf"
        if not (Path(cache) / "gguf").exists() and here.is_dir():
            (Path(cache) / "gguf").symlink_to(here)  # the same GGUF: no second download
    if cache:
        env["SF_TRT_CACHE"] = cache
    cmd = [sys.executable, __file__, "--worker", "--weights", args.weights, "--window", str(args.window)]
    cmd += (["--root", root] if root else []) + (["--threads", str(args.threads)] if args.threads else [])
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"bench_attention: the worker for {root or 'this checkout'} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _use_root(root: str) -> None:
    """Import ``sf_trt`` from ``root`` (already first on PYTHONPATH), and its ``export`` and
    ``cli`` packages too (an editable install maps those to this checkout)."""
    import importlib.util

    import sf_trt

    if Path(sf_trt.__file__).parent != Path(root) / "sf_trt":
        raise SystemExit(f"bench_attention: sf_trt came from {sf_trt.__file__}, expected {root}/sf_trt")
    for name in ("export", "cli"):
        spec = importlib.util.spec_from_file_location(
            f"sf_trt.{name}", Path(root) / name / "__init__.py", submodule_search_locations=[str(Path(root) / name)],
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)


def _worker(root: str | None, weights: str, window: int, threads: int | None) -> dict:
    if root:
        _use_root(root)
    import numpy as np

    import sf_trt
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.export.pipeline import default_model_dir
    from sf_trt.primitives import Rows

    model_dir = default_model_dir(progress=False, weight_dtype=weights)
    digest = hashlib.sha256()
    tokens = np.random.default_rng(0).integers(100, 10000, max(PREFILLS) + 200)

    def rows(lanes, starts, counts, last_only: bool) -> Rows:
        lane = np.concatenate([np.full(n, l, np.int64) for l, n in zip(lanes, counts)])
        pos = np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, counts)])
        ends = np.cumsum(counts) - 1
        wanted = ends if last_only else np.arange(lane.shape[0])
        return Rows(lane, pos, tokens[pos + 7 * lane], wanted.astype(np.int64))

    def prefill(p, lane: int, n: int):
        """``n`` prompt rows in chunks of max_rows_per_pass, as the executor prefills; the last row's logits."""
        chunk = p.capabilities.max_rows_per_pass
        for start in range(0, n, chunk):
            logits = p.forward(rows([lane], [start], [min(chunk, n - start)], True))
        return logits

    def timed(fn) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - wall, time.process_time() - cpu

    def decode(p, lanes: list[int], start: int, steps: int, tokens_per_step: int) -> dict:
        """``steps`` passes of one row per lane; tok/s over them all, CPU ms per token, and the
        best and median pass (the best is the least disturbed by other jobs on the machine)."""
        passes, cpu = [], time.process_time()
        for i in range(steps):
            wall = time.perf_counter()
            hashed(p.forward(rows(lanes, [start + i] * len(lanes), [1] * len(lanes), True)))
            passes.append(time.perf_counter() - wall)
        cpu = time.process_time() - cpu
        return {"tok_s": tokens_per_step * steps / sum(passes), "cpu_ms_token": 1000 * cpu / (tokens_per_step * steps),
                "best_ms": 1000 * min(passes), "median_ms": 1000 * float(np.median(passes))}

    def hashed(logits) -> None:
        digest.update(np.ascontiguousarray(logits, np.float32).tobytes())

    out = {"sf_trt": str(Path(sf_trt.__file__).parent), "model_dir": str(model_dir)}
    opened = dict(max_context=window, threads=threads)
    prompt, steps = DECODE_1
    with OrtDecoderPrimitives(model_dir, max_lanes=1, **opened) as p:
        hashed(prefill(p, 0, prompt))
        out["decode_1"] = decode(p, [0], prompt, steps, 1)
    lanes, prompt, steps = DECODE_8
    with OrtDecoderPrimitives(model_dir, max_lanes=lanes, **opened) as p:
        for lane in range(lanes):
            hashed(prefill(p, lane, prompt))
        out["decode_8"] = decode(p, list(range(lanes)), prompt, steps, lanes)
        out["ops_8"] = _op_shares(p, rows(list(range(lanes)), [prompt + steps] * lanes, [1] * lanes, True), threads)
    with OrtDecoderPrimitives(model_dir, max_lanes=1, **opened) as p:
        prefill(p, 0, 64)  # the session's first run
        p.release(0)
        for n in PREFILLS:
            wall, cpu = timed(lambda: hashed(prefill(p, 0, n)))
            out[f"prefill_{n}"] = {"s": wall, "cpu_s": cpu}
            p.release(0)
    with open("/proc/self/status", encoding="ascii") as f:
        out["peak_rss_mib"] = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
    out["hash"] = digest.hexdigest()[:16]
    return out


PASS_CASES = {
    "1 lane, 1 row at 1040": (1, 1, 1040),
    "8 lanes, 1 row at 540": (8, 1, 540),
    "8 lanes, 9 rows at 540": (8, 9, 540),
    "1 lane, 512 rows at 512 (a 1k prefill's 2nd chunk)": (1, 512, 512),
    "1 lane, 512 rows at 3584 (a 4k prefill's last chunk)": (1, 512, 3584),
}
"""Lanes, rows per lane, and the first row's position."""


def _compare_graphs(args) -> int:
    import numpy as np
    import onnxruntime as ort

    from sf_trt.backends.ort_decoder import KEY_BLOCK
    from sf_trt.backends.ort_session import open_session
    from sf_trt.export.pipeline import default_model_dir
    from sf_trt.formats.model_dir import ModelDir, PASS_GRAPH_FILE, cache_names
    from sf_trt.models import DEFAULT_MODEL, export_dir

    after_dir = default_model_dir(progress=False, weight_dtype=args.weights)
    before_dir = export_dir(DEFAULT_MODEL.gguf_name, args.weights, Path(args.before_cache))
    if not (before_dir / PASS_GRAPH_FILE).is_file():
        raise SystemExit(f"bench_attention: no {PASS_GRAPH_FILE} in {before_dir}: run once without --passes to export it")
    cfg = ModelDir.open(after_dir).config
    config = {"session.intra_op.allow_spinning": "0"}
    if args.weights == "int8":
        config["session.qdq_matmulnbits_accuracy_level"] = "4"  # as the backend opens an int8 decoder
    sessions = {side: open_session(d / PASS_GRAPH_FILE, threads=args.threads, config=config) for side, d in
                (("before", before_dir), ("after", after_dir))}
    rng = np.random.default_rng(0)
    window = args.window + 1
    print(f"load average {os.getloadavg()[0]:.2f}; {args.passes} passes of each graph per case, alternating")
    print("| pass | before: best / median ms | after: best / median ms | best ratio | median ratio | bits equal |")
    print("|---|---:|---:|---:|---:|---|")
    failed = 0
    wanted = [c for c in args.cases.split(",") if c]
    for name, (lanes, t, first) in PASS_CASES.items():
        if wanted and not any(c in name for c in wanted):
            continue
        extent = min(window, -(-(first + t) // KEY_BLOCK) * KEY_BLOCK)
        shape = (lanes, cfg.n_kv_heads, window, cfg.head_dim)
        whole = [np.zeros(shape, np.float32) for _ in range(2 * cfg.n_layers)]
        for arr in whole:
            arr[:, :, :first] = rng.standard_normal((lanes, cfg.n_kv_heads, first, cfg.head_dim), np.float32)
        caches = {"before": whole, "after": [np.ascontiguousarray(arr[:, :, :extent]) for arr in whole]}
        feeds = {"input_ids": rng.integers(100, 10000, (lanes, t)), "positions": np.broadcast_to(first + np.arange(t), (lanes, t)).copy(),
                 "logit_index": np.arange(lanes * t, dtype=np.int64)}
        bindings, times, logits = {}, {"before": [], "after": []}, {}
        for side, sess in sessions.items():
            b = sess.io_binding()
            for key, value in feeds.items():
                b.bind_cpu_input(key, value)
            names = [n for i in range(cfg.n_layers) for n in cache_names(i)]
            for n, arr in zip(names, caches[side]):
                b.bind_ortvalue_input(n, ort.OrtValue.ortvalue_from_numpy(arr))
            b.bind_output("logits")
            bindings[side] = b
        for _ in range(args.passes):
            for side, sess in sessions.items():
                start = time.perf_counter()
                sess.run_with_iobinding(bindings[side])
                times[side].append(time.perf_counter() - start)
                logits[side] = bindings[side].get_outputs()[0].numpy()
        same = np.array_equal(logits["before"].view(np.uint32), logits["after"].view(np.uint32))
        failed += not same
        best = {side: 1000 * min(v) for side, v in times.items()}
        median = {side: 1000 * float(np.median(v)) for side, v in times.items()}
        print(f"| {name} | {best['before']:.1f} / {median['before']:.1f} | {best['after']:.1f} / {median['after']:.1f} | "
              f"{best['before'] / best['after']:.2f}x | {median['before'] / median['after']:.2f}x | {'yes' if same else 'NO'} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 1 if failed else 0


def _op_shares(p, rows, threads: int | None, passes: int = 5) -> dict[str, float]:
    """onnxruntime's profile of ``passes`` passes over ``rows``: kernel ms per pass, and each op
    type's share of it (%), largest first."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        kernel = kernel_us_by_op(p.profile_passes(rows, passes, str(Path(tmp) / "ops"), threads=threads))
    total = sum(kernel.values())
    return {"kernel_ms": total / passes / 1000, **{op: 100 * us / total for op, us in kernel.most_common()}}


def _table(runs: list[dict]) -> None:
    print("| side | round | load | 1 lane @1k: tok/s, best pass ms (CPU ms/tok) | 8 lanes @512: tok/s, best pass ms (CPU ms/tok) | "
          + " | ".join(f"prefill {n}: s (CPU s)" for n in PREFILLS) + " | peak RSS MiB | logits hash |")
    print("|---|---:|---:|---:|---:|" + "---:|" * len(PREFILLS) + "---:|---|")
    for r in runs:
        cells = [r["side"], str(r["round"]), f"{r['load']:.2f}"]
        cells += [f"{r[k]['tok_s']:.1f}, {r[k]['best_ms']:.1f} ({r[k]['cpu_ms_token']:.1f})" for k in ("decode_1", "decode_8")]
        cells += [f"{r[f'prefill_{n}']['s']:.2f} ({r[f'prefill_{n}']['cpu_s']:.2f})" for n in PREFILLS]
        cells += [f"{r['peak_rss_mib']:.0f}", r["hash"]]
        print("| " + " | ".join(cells) + " |")
    print("\nonnxruntime's profile of an 8-lane pass (kernel ms per pass; op shares, %):")
    for r in runs:
        ops = r["ops_8"]
        top = ", ".join(f"{op} {share:.1f}" for op, share in list(ops.items())[1:7])
        print(f"  {r['side']} round {r['round']}: {ops['kernel_ms']:.1f} ms: {top}")


if __name__ == "__main__":
    sys.exit(main())

"""Where a generated token's time goes, end to end: inside the decoder pass or outside it.

    python tools/profile_decode.py [--prompt-id story_lighthouse] [--max-tokens 192] [--threads 2]
                                   [--weights int8] [--speculate] [--sample] [--lanes N] [--ops]
                                   [--cprofile 25] [--json]

Runs one request of ``tools/prompts/bench.jsonl`` (``--lanes N``: the file's first N, at once)
through the same path as ``sf-trt generate`` (the model opened through the entry points'
ModelSpec and BackendSpec, a Generator with the batch scheduler), once to warm up, then timed. The timed run counts the seconds
spent in onnxruntime's decoder run (``run_with_iobinding``) and in its sampler runs, so the rest,
per token, is what is not the pass: host-side cache writes, the executor, the generator, Python;
the same requests' prefill (one token each) is measured apart and left out of the decode figures.
``--ops`` adds onnxruntime's own profile of passes of one row per lane (the share of kernel time
per op type: where a pass goes). ``--cprofile N`` runs it once more under cProfile and prints the
N functions with the most time of their own (cProfile slows Python down, so read its table for
where, the timed run for how much)."""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ort_ops import kernel_us_by_op  # noqa: E402

PROMPTS = Path(__file__).with_name("prompts") / "bench.jsonl"
OP_PROFILE_PASSES = 10


class _Timed:
    """A callable that forwards to ``fn`` and adds its seconds to ``seconds``."""

    def __init__(self, fn: Callable) -> None:
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


def main(argv: Sequence[str] | None = None) -> None:
    """Time per token inside and outside the decoder pass, for requests run like `sf-trt generate`."""
    from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
    from sf_trt.backends import BackendSpec
    from sf_trt.entrypoints.model import ModelSpec, resolve
    from sf_trt.formats.model_dir import DEFAULT_WEIGHTS
    from sf_trt.generate import Generator, Request

    ap = _parser()
    args = ap.parse_args(argv)

    lines = [json.loads(s) for s in args.prompts.read_text().splitlines() if s.strip()]
    if args.lanes == 1:
        chosen = [p for p in lines if p["id"] == args.prompt_id]
        if not chosen:
            ap.error(f"--prompt-id {args.prompt_id!r} is not in {args.prompts} (ids: {', '.join(p['id'] for p in lines)})")
    else:  # N lanes: the file's first N prompts, repeated when it has fewer
        chosen = [lines[i % len(lines)] for i in range(args.lanes)]
    model = resolve(ModelSpec(weights=args.weights or DEFAULT_WEIGHTS))
    prompts = [model.tokenizer.encode_chat(p["messages"], add_generation_prompt=True) for p in chosen]
    flags = SamplingFlag.IGNORE_EOS
    mode, params = (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.max_tokens, flags=flags)) \
        if args.sample else (Sampling.GPU_GREEDY, SamplingParams(max_tokens=args.max_tokens, flags=flags))
    seed = 1 if args.sample else 0
    window = -(-(max(map(len, prompts)) + args.max_tokens) // 256) * 256
    prims = BackendSpec(threads=args.threads).open(model.model_dir.path, max_lanes=args.lanes, max_context=window)
    requests = [Request(ids, mode, params, seed=seed, speculate=args.speculate) for ids in prompts]

    pass_timer, sampler_timer = _timers(prims)

    gen = Generator(prims)
    gen.run([Request(prompts[0][:32], mode, params, seed=seed, speculate=False)])  # warm up
    prefill = _prefill_seconds(gen, requests, pass_timer)
    pass_timer.seconds = pass_timer.calls = 0
    sampler_timer.seconds = sampler_timer.calls = 0
    t0 = time.perf_counter()
    results = gen.run(requests)
    wall = time.perf_counter() - t0
    n = sum(len(r.tokens) for r in results)
    decode_wall = wall - prefill["wall"]
    decode_pass = pass_timer.seconds - prefill["pass"]
    out = {
        "model": str(model.model_dir.path), "weights": prims.weight_dtype, "prompt_id": args.prompt_id if args.lanes == 1 else None,
        "prompt_ids": [p["id"] for p in chosen], "lanes": args.lanes,
        "prompt_tokens": sum(map(len, prompts)), "tokens": n, "speculate": args.speculate, "sampled": args.sample,
        "threads": args.threads, "load": round(os.getloadavg()[0], 2),
        "tokens_per_s": round(n / wall, 2),
        "decode_tokens_per_s": round(n / decode_wall, 2),
        "decode_ms_per_token": round(1e3 * decode_wall / n, 3),
        "decoder_pass_ms_per_token": round(1e3 * decode_pass / n, 3),
        "sampler_ms_per_token": round(1e3 * sampler_timer.seconds / n, 3),
        "outside_pass_ms_per_token": round(1e3 * (decode_wall - decode_pass) / n, 3),
        "outside_pass_share": round((decode_wall - decode_pass) / decode_wall, 4),
        "decoder_runs": pass_timer.calls, "sampler_runs": sampler_timer.calls,
        "prefill_s": round(prefill["wall"], 3),
    }
    if args.ops:
        out["ops"] = _op_profile(prims, args.threads, args.lanes, window, args.ops_position)
    _print(out, args, pass_timer.calls, sampler_timer.calls)
    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        gen.run(requests)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.cprofile)
        print(text.getvalue())
    prims.close()


def _timers(prims) -> tuple[_Timed, _Timed]:
    """Timers around onnxruntime's decoder run (nothing around it) and the verify-and-sample
    graph's runs (with their feeds), through the decoder's profiling hook."""
    timers = {}

    def timed(name: str) -> Callable:
        def wrap(fn: Callable) -> _Timed:
            timers[name] = _Timed(fn)
            return timers[name]
        return wrap

    prims.instrument(decoder_run=timed("pass"), sampler_run=timed("sampler"))
    return timers["pass"], timers["sampler"]


def _op_profile(prims, threads: int, lanes: int, window: int, position: int) -> dict:
    """onnxruntime's own profile of decoder passes of one row per lane at ``position``: the
    share of kernel time per op type (a session like the runtime's, with profiling on)."""
    import numpy as np

    from sf_trt.primitives import Rows

    position = min(position, window - 1)
    with tempfile.TemporaryDirectory() as tmp:
        slots = np.arange(lanes, dtype=np.int64)
        rows = Rows(slots, np.full(lanes, position, np.int64), np.ones(lanes, np.int64), slots.copy())
        micros = kernel_us_by_op(prims.profile_passes(rows, OP_PROFILE_PASSES, str(Path(tmp) / "ops"), threads=threads))
    total = sum(micros.values())
    return {"lanes": lanes, "position": position, "passes": OP_PROFILE_PASSES,
            "kernel_ms_per_pass": round(total / OP_PROFILE_PASSES / 1e3, 3),
            "share": {op: round(us / total, 4) for op, us in sorted(micros.items(), key=lambda kv: -kv[1])}}


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python tools/profile_decode.py", description=main.__doc__)
    ap.add_argument("--prompts", type=Path, default=PROMPTS)
    ap.add_argument("--prompt-id", default="story_lighthouse", help="the prompt's id in --prompts")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default=None, help="the weights the model is exported with (default: int8, what the CLI's auto picks for the default model)")
    ap.add_argument("--speculate", action="store_true", help="prompt lookup on (default: plain decode)")
    ap.add_argument("--sample", action="store_true", help="temperature 0.8, top-p 0.95, seed 1 (default: greedy)")
    ap.add_argument("--lanes", type=int, default=1,
                    help="run the first N prompts of --prompts at once in N lanes (default 1: --prompt-id alone)")
    ap.add_argument("--ops", action="store_true",
                    help="also profile decoder passes of one row per lane with onnxruntime's profiler: the share of "
                    "kernel time per op type")
    ap.add_argument("--ops-position", type=int, default=400, help="the rows' position in the --ops passes (default 400)")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N", help="one more run under cProfile; print its top N")
    ap.add_argument("--json", action="store_true", help="print the timed run's numbers as one JSON object")
    return ap


def _print(out: dict, args, decoder_runs: int, sampler_runs: int) -> None:
    """The timed run's numbers: one JSON object with ``--json``, else a few lines."""
    if args.json:
        print(json.dumps(out))
        return
    what = f"prompt {args.prompt_id}" if args.lanes == 1 else f"{args.lanes} lanes ({', '.join(out['prompt_ids'])})"
    print(f"{out['model']} ({out['weights']}), {what} ({out['prompt_tokens']} prompt tokens), {out['tokens']} tokens, "
          f"{'speculative' if args.speculate else 'plain'}, {'sampled' if args.sample else 'greedy'}, "
          f"{args.threads} threads, load {out['load']}")
    print(f"  {out['tokens_per_s']} tok/s end to end (prefill {out['prefill_s']} s), {out['decode_tokens_per_s']} tok/s decoding; "
          f"decode {out['decode_ms_per_token']} ms/token:")
    print(f"  decoder pass {out['decoder_pass_ms_per_token']} ms/token ({decoder_runs} runs), "
          f"outside it {out['outside_pass_ms_per_token']} ms/token ({100 * out['outside_pass_share']:.1f}%), "
          f"of which sampler runs {out['sampler_ms_per_token']} ms/token ({sampler_runs} runs)")
    if "ops" in out:
        ops = out["ops"]
        top = ", ".join(f"{op} {100 * share:.1f}%" for op, share in list(ops["share"].items())[:8])
        print(f"  one pass of {ops['lanes']} row(s) at position {ops['position']} (onnxruntime's profiler, {ops['passes']} passes, "
              f"{ops['kernel_ms_per_pass']} ms of kernels each): {top}")


def _prefill_seconds(gen, requests, pass_timer: _Timed) -> dict:
    """Wall and pass seconds of the requests' prefill alone (one token each, together), to take out of the decode figures."""
    best = None
    for _ in range(2):
        before = pass_timer.seconds
        t0 = time.perf_counter()
        gen.run([dataclasses.replace(r, speculate=False, params=dataclasses.replace(r.params, max_tokens=1)) for r in requests])
        this = {"wall": time.perf_counter() - t0, "pass": pass_timer.seconds - before}
        best = this if best is None or this["wall"] < best["wall"] else best
    return best


if __name__ == "__main__":
    main()

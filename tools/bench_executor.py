"""Benchmark the executor's own cost, beside the fake's onnxruntime cost, in one run.

    python tools/bench_executor.py [--ticks 20] [--json bench_executor.json]

Part 1 runs the copy-model fake through the Executor at 1, 8 and 32 lanes (half
of them speculating, a quarter sampled), then at 8 and 32 lanes all sampled
(Gumbel, temperature 0.8, top-p 0.95), and splits each tick's wall time into the time spent
inside the primitives (onnxruntime: forward and verify-and-sample) and the rest,
which is the executor's own (plan check, drafting, packing, accept, rollback,
emit). Part 2 times prompt-lookup drafting per token (append one token, propose
a draft) at histories of 1k and 32k tokens. The machine is shared and noisy:
read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
from sf_trt.drafting import PromptLookupConfig, PromptLookupDrafter
from sf_trt.engine import Plan
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives


class TimedPrimitives:
    """Delegates to a backend and adds up the seconds spent inside it."""

    def __init__(self, inner):
        self._inner = inner
        self.capabilities = inner.capabilities
        self.seconds = 0.0
        self.passes = 0

    def _timed(self, name, *args):
        t0 = time.perf_counter()
        try:
            return getattr(self._inner, name)(*args)
        finally:
            self.seconds += time.perf_counter() - t0

    def forward(self, rows):
        self.passes += 1
        return self._timed("forward", rows)

    def verify_sample(self, logits, sample):
        return self._timed("verify_sample", logits, sample)

    def truncate(self, lane, length):
        return self._timed("truncate", lane, length)

    def release(self, lane):
        return self._timed("release", lane)

    def state_len(self, lane):
        return self._inner.state_len(lane)


def bench_lanes(num_lanes: int, ticks: int, per_tick: int, all_sampled: bool = False) -> dict:
    cfg = FakeConfig(vocab=512, eos=511, copy_model=True, copy_miss_every=7, verify_rows=True,
                     max_lanes=num_lanes, max_context=4096, max_rows_per_pass=max(64, num_lanes * 10))
    prims = TimedPrimitives(FakePrimitives(cfg))
    ex = Executor(prims, ExecutorConfig())
    slot, _ = ex.register_strategy("prompt_lookup", bytes(32), bytes(32), 0)
    rng = random.Random(num_lanes)
    plan = Plan()
    for lane in range(num_lanes):
        phrase = [rng.randrange(500) for _ in range(12)]
        prompt = (phrase * 8)[:80]
        pid = ex.register_prompt(prompt)
        params = SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)
        gumbel = all_sampled or lane % 4 == 3
        plan.admit(lane, pid, strategy_slot=slot if lane % 2 == 0 else 0, sampling=Sampling.GPU_GUMBEL if gumbel else Sampling.GPU_GREEDY,
                   params=params, rng_counter_base=lane).prefill(lane, 0, len(prompt))
    ex.tick(plan)
    prims.seconds, prims.passes = 0.0, 0
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(ticks):
        plan = Plan()
        for lane in range(num_lanes):
            plan.decode(lane, per_tick)
        for e in ex.tick(plan):
            tokens += e.token_ref.length
    wall = time.perf_counter() - t0
    own = wall - prims.seconds
    return {
        "lanes": num_lanes, "sampled": "all" if all_sampled else "1/4", "ticks": ticks, "tokens": tokens, "passes": prims.passes,
        "wall_ms_per_tick": 1e3 * wall / ticks,
        "backend_ms_per_pass": 1e3 * prims.seconds / prims.passes,
        "executor_ms_per_pass": 1e3 * own / prims.passes,
        "executor_us_per_token": 1e6 * own / tokens,
        "executor_share": own / wall,
    }


def bench_drafting(history_len: int, steps: int) -> dict:
    rng = random.Random(history_len)
    # Text-like: a vocabulary of 4k ids with recurring phrases, so lookups hit and miss.
    phrases = [[rng.randrange(4096) for _ in range(rng.randrange(3, 12))] for _ in range(300)]
    history: list[int] = []
    while len(history) < history_len + steps:
        history.extend(phrases[rng.randrange(len(phrases))] if rng.random() < 0.7 else [rng.randrange(4096)])
    t0 = time.perf_counter()
    drafter = PromptLookupDrafter(PromptLookupConfig(), history[:history_len])
    build = time.perf_counter() - t0
    proposed = 0
    t0 = time.perf_counter()
    for tok in history[history_len : history_len + steps]:
        drafter.extend((tok,))
        proposed += len(drafter.propose(8))
    per_token = (time.perf_counter() - t0) / steps
    return {"history": history_len, "steps": steps, "us_per_token": 1e6 * per_token,
            "build_us_per_token": 1e6 * build / history_len, "mean_draft": proposed / steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=20, help="decode ticks per lane count (default 20)")
    ap.add_argument("--per-tick", type=int, default=16, help="tokens per lane per tick (default 16)")
    ap.add_argument("--lanes", type=int, nargs="+", default=[1, 8, 32], help="lane counts (default 1 8 32)")
    ap.add_argument("--sampled-lanes", type=int, nargs="*", default=[8, 32], help="lane counts run with every lane sampled (default 8 32)")
    ap.add_argument("--json", type=Path, default=Path("bench_executor.json"), help="where to write the results")
    args = ap.parse_args(argv)

    lane_rows = [bench_lanes(n, args.ticks, args.per_tick) for n in args.lanes]
    lane_rows += [bench_lanes(n, args.ticks, args.per_tick, all_sampled=True) for n in args.sampled_lanes]
    print(f"{'lanes':>5} {'sampled':>7} {'tokens':>7} {'passes':>6} {'tick ms':>8} {'onnxruntime ms/pass':>20} {'executor ms/pass':>17} {'executor us/token':>18} {'executor share':>15}")
    for r in lane_rows:
        print(f"{r['lanes']:>5} {r['sampled']:>7} {r['tokens']:>7} {r['passes']:>6} {r['wall_ms_per_tick']:>8.2f} {r['backend_ms_per_pass']:>20.3f} "
              f"{r['executor_ms_per_pass']:>17.3f} {r['executor_us_per_token']:>18.1f} {100 * r['executor_share']:>14.0f}%")
    draft_rows = [bench_drafting(n, 20000) for n in (1024, 32768)]
    print()
    print(f"{'history':>8} {'draft us/token':>15} {'index build us/token':>21} {'mean draft':>11}")
    for r in draft_rows:
        print(f"{r['history']:>8} {r['us_per_token']:>15.2f} {r['build_us_per_token']:>21.2f} {r['mean_draft']:>11.2f}")
    ratio = draft_rows[1]["us_per_token"] / draft_rows[0]["us_per_token"]
    print(f"\ndrafting cost at 32k / at 1k history: {ratio:.2f}x")
    args.json.write_text(json.dumps({"executor": lane_rows, "drafting": draft_rows, "drafting_32k_over_1k": ratio}, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What logit adjustments (penalties, logit bias) cost a pass: ``verify_sample`` on SmolLM2's
vocabulary (49152) without adjustments and with presence, frequency and repetition penalties
and a bias over a 300-token prompt and 100 output tokens, interleaved, medians and minimums,
plus the step's books and packing (``LanePenalties.rows`` and ``pack``). The load is printed
(``uptime``). Run: ``python tools/bench_adjust.py``; ``--e2e`` instead times decode passes
of the real model (float32, one lane, 300-token prompt, 48 tokens, 4 per tick) with and
without the same adjustments, interleaved, seconds after the first tick per pass."""
import os, sys, time, statistics
import numpy as np
from sf_trt.abi import SamplingParams
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.penalties import LanePenalties, pack
from sf_trt.primitives import SampleRows

V = 49152


def e2e() -> None:
    from sf_trt.abi import Sampling, SamplingFlag
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.export.pipeline import default_model_dir
    from sf_trt.generate import Generator
    from sf_trt.scheduler import Request

    os.system("uptime")
    off = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=48, flags=SamplingFlag.IGNORE_EOS)
    on = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=48, flags=SamplingFlag.IGNORE_EOS, presence_penalty=0.5,
                        frequency_penalty=0.5, repetition_penalty=1.2, logit_bias={5: 1.0})
    prompt = list(range(1000, 1300))
    with OrtDecoderPrimitives(default_model_dir(progress=False, weight_dtype="float32"), max_lanes=1, max_context=512, threads=2) as p:
        gen = Generator(p, tick_tokens=4)
        t = {"off": [], "on": []}
        for rep in range(7):
            for name, params in (("off", off), ("on", on)):
                (r,) = gen.run([Request(prompt, Sampling.GPU_GUMBEL, params, seed=rep, speculate=False)])
                t[name].append((r.seconds - r.first_token_s) / (r.passes - 4))
        for name, v in t.items():
            print(f"{name}: median {statistics.median(v[1:]) * 1e3:.2f} ms/pass, min {min(v[1:]) * 1e3:.2f}")
    os.system("uptime")


if "--e2e" in sys.argv:
    e2e()
    sys.exit()
os.system("uptime")
p = FakePrimitives(FakeConfig(vocab=V, eos=2, verify_rows=True, max_lanes=8, top_k_limit=1024))
rng = np.random.default_rng(0)
prompt = rng.integers(0, V, 300).tolist()
params = SamplingParams(temperature=0.8, top_p=0.95, presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2, logit_bias={5: 1.0})
for lanes, rows_per_lane in ((1, 1), (1, 9), (8, 1)):
    R = lanes * rows_per_lane
    logits = rng.normal(0, 3, (R, V)).astype(np.float32)
    base = dict(mode=np.ones(R, np.int64), temperature=np.full(R, 0.8, np.float32), top_p=np.full(R, 0.95, np.float32),
                top_k=np.zeros(R, np.int64), rng_counter_base=np.arange(R, dtype=np.int64), position=np.arange(R, dtype=np.int64) + 400,
                draft=np.full(R, -1, np.int64))
    books = []
    for l in range(lanes):
        b = LanePenalties(params, prompt, 2)
        b.extend(rng.integers(0, V, 100).tolist())
        books.append(b)
    def adjust():
        return pack([(l * rows_per_lane, b.rows(rng.integers(0, V, rows_per_lane - 1).tolist())) for l, b in enumerate(books)])
    off_s = SampleRows(**base)
    t = {"off": [], "on": [], "books": []}
    for rep in range(100):
        a = time.perf_counter(); adj = adjust(); t["books"].append(time.perf_counter() - a)
        on_s = SampleRows(**base, adjust=adj)
        a = time.perf_counter(); p.verify_sample(logits, off_s); t["off"].append(time.perf_counter() - a)
        a = time.perf_counter(); p.verify_sample(logits, on_s); t["on"].append(time.perf_counter() - a)
    m = {k: statistics.median(v[5:]) * 1e3 for k, v in t.items()}
    lo = {k: min(v[5:]) * 1e3 for k, v in t.items()}
    print(f"lanes={lanes} rows/lane={rows_per_lane}: verify_sample median off {m['off']:.2f} on {m['on']:.2f} ms (min {lo['off']:.2f} / {lo['on']:.2f}); "
          f"the step's books and packing {m['books']:.3f} ms", flush=True)
os.system("uptime")

#!/usr/bin/env python3
"""The whole TensorRT path on a machine with TensorRT and a GPU, as one table.

    python tools/trt_smoke.py [--engines DIR] [--precision fp16|bf16|fp32] [--cuda-graphs]

Steps (each a row: PASS / FAIL / SKIP, with what it saw):

1. environment: TensorRT version, GPU and compute capability;
2. op check of every graph export/ builds;
3. build: the copy-model engines the seed contract needs, the verify engine,
   the decoder engine (when export/decoder.py exists), each with its manifest;
4. the seed contract (tests/test_prompt_lookup.py) run on the TensorRT fake:
   its FakePrimitives replaced by TensorRT engines built from the same FakeConfig;
5. the decoder engine against the decoder graph on onnxruntime (CPU), same
   inputs, within the tolerance of the build precision;
6. speculative == plain on a few prompts, on the TensorRT fake, greedy and sampled.

Exit status: 0 all rows PASS or SKIP; 1 a row FAILed; 2 TensorRT or a GPU is
not available (nothing was run).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.util
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOLERANCE = {"fp32": (1e-4, 1e-4), "fp16": (2e-2, 2e-2), "bf16": (6e-2, 6e-2)}
"""(atol, rtol) of decoder logits against onnxruntime on the CPU, by precision."""


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, float]] = []

    def run(self, name: str, fn) -> object:
        t0 = time.perf_counter()
        try:
            result = fn()
        except _Skip as s:
            self.rows.append((name, "SKIP", str(s), time.perf_counter() - t0))
            return None
        except Exception as exc:  # a smoke test reports, it does not stop at the first failure
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
            self.rows.append((name, "FAIL", detail, time.perf_counter() - t0))
            traceback.print_exc(file=sys.stderr)
            return None
        detail = result if isinstance(result, str) else ""
        self.rows.append((name, "PASS", detail, time.perf_counter() - t0))
        return result

    def print(self) -> None:
        w = max(len(r[0]) for r in self.rows)
        print(f"\n{'step':{w}}  result  {'seconds':>8}  detail")
        print(f"{'-' * w}  ------  {'-' * 8}  ------")
        for name, status, detail, secs in self.rows:
            print(f"{name:{w}}  {status:6}  {secs:8.1f}  {detail}")

    @property
    def failed(self) -> bool:
        return any(r[1] == "FAIL" for r in self.rows)


class _Skip(Exception):
    pass


def environment() -> tuple[object, str]:
    """``(tensorrt, description)``, or exit 2 saying what is missing."""
    from sf_trt.backends.tensorrt import TensorRTUnavailable
    from sf_trt.backends.tensorrt.probes import device_info, import_tensorrt

    try:
        trt = import_tensorrt()
    except TensorRTUnavailable as exc:
        print(f"TensorRT not available: {str(exc).removeprefix('TensorRT not available: ')}")
        print("This smoke test needs TensorRT 10+ (pip install tensorrt, NVIDIA's index) and an NVIDIA GPU.")
        raise SystemExit(2)
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"torch not available ({exc}): the TensorRT primitives keep their buffers in torch CUDA tensors.")
        raise SystemExit(2)
    try:
        cc, name = device_info()
    except TensorRTUnavailable as exc:
        print(f"TensorRT {trt.__version__} is installed but {exc}")
        raise SystemExit(2)
    return trt, f"TensorRT {trt.__version__}, {name}, compute capability {cc}"


class Engines:
    """Builds engines on demand, one directory per graph digest, and remembers them."""

    def __init__(self, root: Path, precision: str) -> None:
        from sf_trt.export.trt_config import BuildConfig

        self.root, self.precision, self.BuildConfig = root, precision, BuildConfig
        self.built: list[str] = []

    def build(self, name: str, model, *, max_rows: int, max_lanes: int, max_context: int) -> Path:
        import onnx

        from sf_trt.export.trt_build import build_engine
        from sf_trt.formats.manifest import read_manifest

        data = model.SerializeToString()
        key = hashlib.sha256(data + f"{max_rows}/{max_lanes}/{max_context}/{self.precision}".encode()).hexdigest()[:12]
        out = self.root / f"{name}-{key}"
        if (out / "manifest.json").exists() and name in read_manifest(out):
            return out
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{name}.onnx"
        onnx.save(model, path)
        cfg = self.BuildConfig(
            precision=self.precision, max_rows_per_pass=max_rows, max_lanes=max_lanes, max_context=max_context,
            timing_cache=str(self.root / "timing.cache"),
        )
        build_engine(path, cfg, out, log=lambda s: None)
        self.built.append(f"{name}-{key}")
        return out

    def fake_dir(self, cfg) -> Path:
        """A directory holding the copy-model and verify engines for FakeConfig ``cfg``."""
        from sf_trt.graphs.copy_model import build_copy_graph

        copy = build_copy_graph(cfg.vocab, cfg.eos, cfg.max_lanes, cfg.max_context, cfg.copy_miss_every, cfg.copy_model, cfg.favour_logit)
        top_k = min(cfg.top_k_limit, cfg.vocab)
        copy_dir = self.build("copy_model", copy, max_rows=cfg.max_rows_per_pass, max_lanes=cfg.max_lanes, max_context=cfg.max_context)
        verify_dir = self.build("verify", verify_graph(cfg.vocab, top_k), max_rows=cfg.max_rows_per_pass, max_lanes=cfg.max_lanes, max_context=cfg.max_context)
        return self.merged(copy_dir, verify_dir)

    def merged(self, *dirs: Path) -> Path:
        """One directory whose manifest names the engines of all ``dirs``."""
        import shutil

        from sf_trt.formats.manifest import read_manifest, write_manifest

        both = self.root / "+".join(d.name for d in dirs)
        if not (both / "manifest.json").exists():
            both.mkdir(parents=True, exist_ok=True)
            for d in dirs:
                for entry in read_manifest(d).values():
                    shutil.copy2(d / entry.engine_file, both / entry.engine_file)
                    write_manifest(both, entry)
        return both

    def decoder_dir(self) -> Path:
        """The tiny random-weight Llama decoder and a verify engine for its vocabulary."""
        cfg, graph = tiny_decoder()
        dec = self.build("decoder", graph, **DECODER_LIMITS)
        ver = self.build("verify", verify_graph(cfg.vocab, 16), **DECODER_LIMITS)
        return self.merged(dec, ver)


DECODER_LIMITS = dict(max_rows=16, max_lanes=2, max_context=64)


def tiny_decoder():
    """``(LlamaConfig, graph)`` of the tiny test Llama (sf_trt.export.tiny), caches symbolic (as exported)."""
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

    cfg = tiny_llama_config()
    return cfg, build_decoder_graph(cfg, random_llama_weights(cfg, seed=0))


def decoder_stand_in():
    """The decoder's pass logic on onnxruntime (CPU), sized like the engine."""
    from sf_trt.backends.tensorrt import TensorRTPrimitives

    cfg, graph = tiny_decoder()
    return TensorRTPrimitives.stand_in(
        graph, verify_graph(cfg.vocab, 16), max_rows_per_pass=DECODER_LIMITS["max_rows"], eos=cfg.eos, top_k_limit=16,
        max_lanes=DECODER_LIMITS["max_lanes"], max_context=DECODER_LIMITS["max_context"],
    )


def verify_graph(vocab: int, top_k_limit: int):
    from sf_trt.graphs.verify import build_verify_graph

    return build_verify_graph(vocab=vocab, top_k_limit=top_k_limit)


def op_check() -> str:
    from sf_trt.export.registry import GRAPHS
    from sf_trt.export.trt_support import check_graph, errors_in

    checked, refused = [], []
    for name, make in GRAPHS.items():
        errs = errors_in(check_graph(make()))
        (refused if errs else checked).append(name)
        for e in errs:
            print(f"  {name}: {e}", file=sys.stderr)
    if refused:
        raise AssertionError(f"refused: {refused}")
    return f"supported: {checked}"


def seed_contract(make_primitives, label: str) -> str:
    """tests/test_prompt_lookup.py with its FakePrimitives replaced by ``make_primitives(cfg)``."""
    tests_dir = str(ROOT / "tests")
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    seed = importlib.import_module("test_prompt_lookup")
    tests = [(n, f) for n, f in vars(seed).items() if n.startswith("test_") and callable(f)]
    failed = []
    original = seed.FakePrimitives
    seed.FakePrimitives = make_primitives
    try:
        for name, fn in tests:
            try:
                fn()
            except _Skip:
                raise
            except Exception as exc:
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
                traceback.print_exc(file=sys.stderr)
    finally:
        seed.FakePrimitives = original
    if failed:
        raise AssertionError(f"{len(failed)} of {len(tests)} seed tests failed: " + " | ".join(failed)[:400])
    return f"{len(tests)} seed tests pass on {label}"


def seed_on_tensorrt_fake(engines: Engines, cuda_graphs: bool) -> str:
    from sf_trt.backends.tensorrt import TensorRTPrimitives
    from sf_trt.fake import FakeConfig

    def trt_fake(cfg: FakeConfig = FakeConfig()):
        return TensorRTPrimitives.fake(engines.fake_dir(cfg), cfg, cuda_graphs=cuda_graphs)

    return seed_contract(trt_fake, "the TensorRT fake")


def stand_in_fake(cfg):
    """The TensorRT fake's pass logic on onnxruntime (CPU): the same graphs, no engines."""
    from sf_trt.graphs.copy_model import build_copy_graph
    from sf_trt.backends.tensorrt import TensorRTPrimitives

    copy = build_copy_graph(cfg.vocab, cfg.eos, cfg.max_lanes, cfg.max_context, cfg.copy_miss_every, cfg.copy_model, cfg.favour_logit)
    top_k = min(cfg.top_k_limit, cfg.vocab)
    return TensorRTPrimitives.stand_in(
        copy, verify_graph(cfg.vocab, top_k), max_rows_per_pass=cfg.max_rows_per_pass, eos=cfg.eos, top_k_limit=top_k,
        verify_rows=cfg.verify_rows, truncate_partial=cfg.truncate_partial, kernel_capabilities=cfg.kernel_capabilities,
    )


def decoder_vs_onnxruntime(engines: Engines, precision: str, cuda_graphs: bool) -> str:
    """The decoder engine and the decoder graph on onnxruntime (CPU), fed the same passes."""
    import numpy as np

    from sf_trt.backends.tensorrt import TensorRTPrimitives
    from sf_trt.primitives import Rows

    cfg, _ = tiny_decoder()
    trt_p = TensorRTPrimitives.open(engines.decoder_dir(), model="decoder", eos=cfg.eos, cuda_graphs=cuda_graphs)
    cpu_p = decoder_stand_in()

    def rows(lanes, positions, tokens, logit_rows):
        return Rows(*(np.asarray(a, np.int64) for a in (lanes, positions, tokens, logit_rows)))

    passes = [
        rows([0] * 8, range(8), [5, 9, 17, 3, 5, 9, 40, 41], range(8)),  # prefill lane 0, every row's logits
        rows([1] * 5 + [0], list(range(5)) + [8], [7, 8, 7, 8, 7, 2], [4, 5]),  # prefill lane 1 beside a decode
        rows([0, 1], [9, 5], [11, 12], [0, 1]),  # a decode step of both lanes
        rows([0, 1], [10, 6], [13, 14], [0, 1]),  # the same shape again (replayed under --cuda-graphs)
    ]
    atol, rtol = TOLERANCE[precision]
    worst = 0.0
    for i, r in enumerate(passes):
        got, want = trt_p.logits_host(trt_p.forward(r)), cpu_p.logits_host(cpu_p.forward(r))
        worst = max(worst, float(np.max(np.abs(got - want))))
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol, err_msg=f"pass {i} ({precision})")
    trt_p.close()
    return f"{len(passes)} passes, {precision}: max |logit diff| {worst:.3g} (atol {atol}, rtol {rtol})"


SPEC_CFG = dict(vocab=512, eos=511, copy_model=True, copy_miss_every=4, verify_rows=True, max_lanes=8, max_context=256, max_rows_per_pass=256)


def speculative_equals_plain(make_primitives, lanes: int = 4, vocab: int = 512, per_tick: int = 16, ticks: int = 3) -> str:
    """Lanes together, greedy and sampled: speculating emits what a plain decode emits.

    ``make_primitives(FakeConfig)`` makes the backend (a decoder's ignores the config)."""
    from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
    from sf_trt.executor import Executor, ExecutorConfig
    from sf_trt.fake import FakeConfig
    from sf_trt.testing import Harness, register_prompt_lookup_with

    cfg = FakeConfig(**SPEC_CFG)
    prompts = [[10, 11, 12, 13, 10, 11, 12], [7, 8, 9, 7, 8, 9, 7], [100, 200, 300, 400, 100, 200], [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]]
    prompts = [[t % vocab for t in p] for p in prompts[:lanes]]
    modes = [
        (Sampling.GPU_GREEDY, SamplingParams(flags=SamplingFlag.IGNORE_EOS)),
        (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)),
    ]

    def run(speculate: bool, mode, params) -> tuple[list[list[int]], int]:
        h = Harness.with_engine(Executor(make_primitives(cfg), ExecutorConfig()))
        slot = register_prompt_lookup_with(h, bytes([1]) * 32, bytes([2]) * 32, 0)[0] if speculate else 0
        lane_ids = range(1, len(prompts) + 1)
        plan = h.plan()
        for lane, prompt in zip(lane_ids, prompts):
            plan = plan.admit(lane, h.prompt(prompt), strategy_slot=slot, sampling=mode, params=params, rng_counter_base=lane)
            plan = plan.prefill(lane, 0, len(prompt))
        out, proposed = {lane: [] for lane in lane_ids}, 0
        for _ in range(ticks):
            for lane in lane_ids:
                plan = plan.decode(lane, per_tick)
            ev = h.tick_ok(plan)
            for lane in lane_ids:
                e = ev.emit_for(lane)
                out[lane] += h.rings_tokens(e.token_ref)
                proposed += e.spec.proposed
            plan = h.plan()
        return [out[lane] for lane in lane_ids], proposed

    want = per_tick * ticks
    drafts = 0
    for mode, params in modes:
        (plain, _), (spec, proposed) = run(False, mode, params), run(True, mode, params)
        if any(len(t) != want for t in plain):
            raise AssertionError(f"{mode.name}: expected {want} tokens per lane, got {[len(t) for t in plain]}")
        if plain != spec:
            raise AssertionError(f"{mode.name}: speculative decode differs from plain")
        drafts += proposed
    return f"{len(prompts)} prompts x {len(modes)} modes, {want} tokens each, {drafts} draft tokens verified: speculative == plain"


def decoder_speculation(engines: Engines, cuda_graphs: bool) -> str:
    from sf_trt.backends.tensorrt import TensorRTPrimitives

    cfg, _ = tiny_decoder()
    engine_dir = engines.decoder_dir()
    make = lambda _cfg: TensorRTPrimitives.open(engine_dir, model="decoder", eos=cfg.eos, cuda_graphs=cuda_graphs)  # noqa: E731
    return speculative_equals_plain(make, lanes=DECODER_LIMITS["max_lanes"], vocab=cfg.vocab, per_tick=12)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default=None, help="engine cache directory (default: a temporary one)")
    ap.add_argument("--precision", choices=sorted(TOLERANCE), default="fp16", help="decoder build precision (verify is always fp32)")
    ap.add_argument("--cuda-graphs", action="store_true", help="capture decode steps into CUDA graphs")
    args = ap.parse_args(argv)

    _, env = environment()
    from sf_trt.backends.tensorrt import TensorRTPrimitives

    table = Table()
    table.rows.append(("environment", "PASS", env, 0.0))
    with tempfile.TemporaryDirectory(prefix="sf_trt_smoke_") as tmp:
        engines = Engines(Path(args.engines or tmp), args.precision)
        table.run("op check (every registry graph)", op_check)
        table.run("build: TensorRT fake engines", lambda: f"engine dir {engines.fake_dir(_seed_cfg())}")
        table.run("seed contract on the TensorRT fake", lambda: seed_on_tensorrt_fake(engines, args.cuda_graphs))
        table.run(f"decoder logits vs onnxruntime CPU ({args.precision})", lambda: decoder_vs_onnxruntime(engines, args.precision, args.cuda_graphs))
        table.run(
            "speculative == plain (TensorRT fake)",
            lambda: speculative_equals_plain(lambda cfg: TensorRTPrimitives.fake(engines.fake_dir(cfg), cfg, cuda_graphs=args.cuda_graphs)),
        )
        table.run("speculative == plain (TensorRT decoder)", lambda: decoder_speculation(engines, args.cuda_graphs))
        table.rows.append(("engines built", "PASS", ", ".join(engines.built) or "(cached)", 0.0))
        table.print()
    return 1 if table.failed else 0


def _seed_cfg():
    from sf_trt.fake import FakeConfig

    return dataclasses.replace(FakeConfig(), verify_rows=True, copy_model=True, vocab=512, eos=511)


if __name__ == "__main__":
    sys.exit(main())

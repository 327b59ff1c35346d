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
    from export.trt_build import BuildError, device_info, import_tensorrt

    try:
        trt = import_tensorrt()
    except BuildError as exc:
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
    except BuildError as exc:
        print(f"TensorRT {trt.__version__} is installed but {exc}")
        raise SystemExit(2)
    return trt, f"TensorRT {trt.__version__}, {name}, compute capability {cc}"


class Engines:
    """Builds engines on demand, one directory per graph digest, and remembers them."""

    def __init__(self, root: Path, precision: str) -> None:
        from export.trt_build import BuildConfig

        self.root, self.precision, self.BuildConfig = root, precision, BuildConfig
        self.built: list[str] = []

    def build(self, name: str, model, *, max_rows: int, max_lanes: int, max_context: int) -> Path:
        import onnx

        from export.trt_build import build_engine, read_manifest

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
        from export.copy_model import build_copy_graph

        copy = build_copy_graph(cfg.vocab, cfg.eos, cfg.max_lanes, cfg.max_context, cfg.copy_miss_every, cfg.copy_model, cfg.favour_logit)
        top_k = min(cfg.top_k_limit, cfg.vocab)
        copy_dir = self.build("copy_model", copy, max_rows=cfg.max_rows_per_pass, max_lanes=cfg.max_lanes, max_context=cfg.max_context)
        verify_dir = self.build("verify", verify_graph(cfg.vocab, top_k), max_rows=cfg.max_rows_per_pass, max_lanes=cfg.max_lanes, max_context=cfg.max_context)
        # One manifest naming both engines: merge the verify entry into the copy-model directory.
        import shutil

        from export.trt_build import read_manifest, write_manifest

        both = self.root / f"fake-{copy_dir.name}-{verify_dir.name}"
        if not (both / "manifest.json").exists():
            both.mkdir(parents=True, exist_ok=True)
            for d in (copy_dir, verify_dir):
                for entry in read_manifest(d).values():
                    shutil.copy2(d / entry.engine_file, both / entry.engine_file)
                    write_manifest(both, entry)
        return both


def verify_graph(vocab: int, top_k_limit: int):
    if importlib.util.find_spec("export.verify") is None:
        raise _Skip("export/verify.py is not written yet")
    from export.verify import build_verify_graph

    return build_verify_graph(vocab=vocab, top_k_limit=top_k_limit)


def op_check() -> str:
    from export.registry import GRAPHS
    from export.trt_support import check_graph, errors_in

    checked, skipped, refused = [], [], []
    for name, make in GRAPHS.items():
        try:
            graph = make()
        except ImportError as exc:
            skipped.append(f"{name} ({exc.name})")
            continue
        errs = errors_in(check_graph(graph))
        (refused if errs else checked).append(name)
        for e in errs:
            print(f"  {name}: {e}", file=sys.stderr)
    if refused:
        raise AssertionError(f"refused: {refused}")
    return f"supported: {checked}" + (f"; not written yet: {skipped}" if skipped else "")


def seed_on_tensorrt_fake(engines: Engines, cuda_graphs: bool) -> str:
    """tests/test_prompt_lookup.py with its FakePrimitives replaced by the TensorRT fake."""
    sys.path.insert(0, str(ROOT / "tests"))
    seed = importlib.import_module("test_prompt_lookup")
    from sf_trt.backends.tensorrt import TensorRTPrimitives
    from sf_trt.fake import FakeConfig

    def trt_fake(cfg: FakeConfig = FakeConfig()):
        return TensorRTPrimitives.fake(engines.fake_dir(cfg), cfg, cuda_graphs=cuda_graphs)

    seed.FakePrimitives = trt_fake
    tests = [(n, f) for n, f in vars(seed).items() if n.startswith("test_") and callable(f)]
    failed = []
    for name, fn in tests:
        try:
            fn()
        except _Skip:
            raise
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
    if failed:
        raise AssertionError(f"{len(failed)} of {len(tests)} seed tests failed: " + " | ".join(failed)[:400])
    return f"{len(tests)} seed tests pass on the TensorRT fake"


def decoder_vs_onnxruntime(engines: Engines, precision: str) -> str:
    """The decoder engine and the decoder graph on onnxruntime, fed the same inputs."""
    if importlib.util.find_spec("export.decoder") is None:
        raise _Skip("export/decoder.py is not written yet")
    import numpy as np
    import onnxruntime as ort
    import tensorrt as trt
    import torch

    from export.registry import GRAPHS
    from export.trt_build import derive_profiles, onnx_io, read_manifest
    from sf_trt.backends.tensorrt import BufferPlan, _TorchDevice, _TrtRunner

    graph = GRAPHS["decoder"]()
    cfg = engines.BuildConfig(max_rows_per_pass=16, max_lanes=2, max_context=64)
    d = engines.build("decoder", graph, max_rows=16, max_lanes=2, max_context=64)
    entry = read_manifest(d)["decoder"]
    dev = _TorchDevice(torch, 0)
    logger = trt.Logger(trt.Logger.WARNING)
    runner = _TrtRunner(trt, trt.Runtime(logger), "decoder", (d / entry.engine_file).read_bytes(), BufferPlan.from_manifest(entry), dev)
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    # A pass of 5 rows on lane 0 from position 0; every other named dim at its max.
    sizes = {**derive_profiles(graph, cfg).max_dims(), "rows": 5}
    feeds = {}
    for t in onnx_io(graph):
        if t.mode != "input":
            continue
        shape = tuple(sizes.get(s, 1) if isinstance(s, str) else s for s in t.shape)
        if t.name == "tokens":
            feeds[t.name] = rng.integers(0, 100, shape).astype(t.dtype)
        elif t.name == "positions":
            feeds[t.name] = np.arange(int(np.prod(shape))).reshape(shape).astype(t.dtype)
        elif t.dtype in ("int64", "int32"):
            feeds[t.name] = np.zeros(shape, t.dtype)
        elif t.dtype == "bool":
            feeds[t.name] = np.ones(shape, bool)
        else:
            feeds[t.name] = (rng.standard_normal(shape) * 0.1).astype(t.dtype)
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    got = runner.run({k: dev.to_device(v) for k, v in feeds.items()})
    atol, rtol = TOLERANCE[precision]
    worst = []
    for name, ref in want.items():
        out = dev.to_host(got[name]).astype(np.float64)
        err = float(np.max(np.abs(out - ref))) if ref.size else 0.0
        worst.append(f"{name}: max |diff| {err:.3g}")
        np.testing.assert_allclose(out, ref, atol=atol, rtol=rtol, err_msg=f"decoder output {name!r} ({precision})")
    return f"{precision}, atol {atol}, rtol {rtol}; " + ", ".join(worst)


def speculative_equals_plain(engines: Engines, cuda_graphs: bool) -> str:
    from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
    from sf_trt.backends.tensorrt import TensorRTPrimitives
    from sf_trt.executor import Executor, ExecutorConfig
    from sf_trt.fake import FakeConfig
    from sf_trt.testing import Harness, register_prompt_lookup_with

    cfg = FakeConfig(vocab=512, eos=511, copy_model=True, copy_miss_every=4, verify_rows=True, max_lanes=8, max_context=256, max_rows_per_pass=256)
    engine_dir = engines.fake_dir(cfg)
    prompts = [[10, 11, 12, 13, 10, 11, 12], [7, 8, 9, 7, 8, 9, 7], [100, 200, 300, 400, 100, 200], [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]]
    modes = [
        (Sampling.GPU_GREEDY, SamplingParams(flags=SamplingFlag.IGNORE_EOS)),
        (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)),
    ]

    def run(speculate: bool, mode, params) -> list[list[int]]:
        h = Harness.with_engine(Executor(TensorRTPrimitives.fake(engine_dir, cfg, cuda_graphs=cuda_graphs), ExecutorConfig()))
        slot = register_prompt_lookup_with(h, bytes([1]) * 32, bytes([2]) * 32, 0)[0] if speculate else 0
        plan = h.plan()
        for lane, prompt in enumerate(prompts, start=1):
            plan = plan.admit(lane, h.prompt(prompt), strategy_slot=slot, sampling=mode, params=params, rng_counter_base=lane)
            plan = plan.prefill(lane, 0, len(prompt)).decode(lane, 16)
        out = {lane: [] for lane in range(1, len(prompts) + 1)}
        ev = h.tick_ok(plan)
        for _ in range(3):
            for lane in out:
                out[lane] += h.rings_tokens(ev.emit_for(lane).token_ref)
            plan = h.plan()
            for lane in out:
                plan = plan.decode(lane, 16)
            ev = h.tick_ok(plan)
        return [out[lane] for lane in sorted(out)]

    for mode, params in modes:
        plain, spec = run(False, mode, params), run(True, mode, params)
        if plain != spec:
            raise AssertionError(f"{mode.name}: speculative decode differs from plain")
    return f"{len(prompts)} prompts x {len(modes)} modes, 48 tokens each: speculative == plain"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default=None, help="engine cache directory (default: a temporary one)")
    ap.add_argument("--precision", choices=sorted(TOLERANCE), default="fp16", help="decoder build precision (verify is always fp32)")
    ap.add_argument("--cuda-graphs", action="store_true", help="capture decode steps into CUDA graphs")
    args = ap.parse_args(argv)

    _, env = environment()
    table = Table()
    table.rows.append(("environment", "PASS", env, 0.0))
    with tempfile.TemporaryDirectory(prefix="sf_trt_smoke_") as tmp:
        engines = Engines(Path(args.engines or tmp), args.precision)
        table.run("op check (every registry graph)", op_check)
        table.run("build: TensorRT fake engines", lambda: f"engine dir {engines.fake_dir(_seed_cfg())}")
        table.run("seed contract on the TensorRT fake", lambda: seed_on_tensorrt_fake(engines, args.cuda_graphs))
        table.run(f"decoder logits vs onnxruntime CPU ({args.precision})", lambda: decoder_vs_onnxruntime(engines, args.precision))
        table.run("speculative == plain (TensorRT fake)", lambda: speculative_equals_plain(engines, args.cuda_graphs))
        table.rows.append(("engines built", "PASS", ", ".join(engines.built) or "(cached)", 0.0))
        table.print()
    return 1 if table.failed else 0


def _seed_cfg():
    from sf_trt.fake import FakeConfig

    return dataclasses.replace(FakeConfig(), verify_rows=True, copy_model=True, vocab=512, eos=511)


if __name__ == "__main__":
    sys.exit(main())

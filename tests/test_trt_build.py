"""Engine builds, manifests, buffer plans and the TensorRT primitives.

Everything here but the ``tensorrt``-marked tests runs on any CPU: profile
derivation, manifest write/read/refusals, buffer plans from the graphs, the
import of the package without TensorRT, and the TensorRT primitives' pass logic
with onnxruntime standing in for the engines. The marked tests build and run
real engines; they skip, saying why, where TensorRT or a GPU is absent.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from sf_trt.export.copy_model import build_copy_graph
from sf_trt.export.registry import GRAPHS
from sf_trt.export.trt_build import (
    DIM_ROLES,
    FIXED_ROLES,
    BuildConfig,
    BuildError,
    EngineManifest,
    IOTensor,
    ManifestError,
    Profile,
    check_manifest,
    derive_profiles,
    manifest_problems,
    onnx_io,
    precision_for,
    read_manifest,
    sha256_file,
    write_manifest,
)
from sf_trt.abi import Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.backends import BACKENDS, create
from sf_trt.backends.tensorrt import BufferPlan, TensorRTPrimitives
from sf_trt.primitives import Rows, SampleRows

ROOT = Path(__file__).resolve().parents[1]


def registry_graph(name: str) -> onnx.ModelProto:
    module = {"verify": "sf_trt.export.verify", "copy_model": "sf_trt.export.copy_model", "decoder": "sf_trt.export.decoder"}[name]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"registry graph {name!r}: its builder {module.replace('.', '/')}.py is not written yet")
    return GRAPHS[name]()


# -- BuildConfig and profiles -----------------------------------------------------------------


def test_build_config_refuses_bad_values_with_what_it_got():
    with pytest.raises(BuildError, match=r"precision 'int8', expected one of \['fp32', 'fp16', 'bf16'\]"):
        BuildConfig(precision="int8")
    with pytest.raises(BuildError, match=r"max_lanes must be an int >= 1 \(got 0\)"):
        BuildConfig(max_lanes=0)
    with pytest.raises(BuildError, match=r"opt_rows_per_pass must be an int in 1..max_rows_per_pass=16 \(got 17\)"):
        BuildConfig(max_rows_per_pass=16, opt_rows_per_pass=17)


def test_profiles_come_from_the_graphs_named_dims():
    graph = registry_graph("copy_model")  # history [4, 128] static; lanes, positions [rows]; logits [rows, 512]
    cfg = BuildConfig(max_rows_per_pass=64, max_lanes=4, max_context=128)
    p = derive_profiles(graph, cfg)
    assert p.dims == {"rows": (1, 4, 64)}  # opt: one decode row per lane
    assert p.inputs == {"lanes": ((1,), (4,), (64,)), "positions": ((1,), (4,), (64,))}
    assert p.static == {"history": (4, 128)}
    assert Profile.from_json(json.loads(json.dumps(p.to_json()))) == p
    p2 = derive_profiles(graph, dataclasses.replace(cfg, opt_rows_per_pass=32))
    assert p2.dims["rows"] == (1, 32, 64)


def _graph_with_input_dims(dims):
    x = h.make_tensor_value_info("x", T.FLOAT, dims)
    y = h.make_tensor_value_info("y", T.FLOAT, dims)
    return h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [x], [y]), opset_imports=[h.make_opsetid("", 17)])


def test_every_role_of_the_dim_table_is_bounded_by_the_config():
    cfg = BuildConfig(max_rows_per_pass=100, max_lanes=7, max_context=300)
    p = derive_profiles(_graph_with_input_dims(["lanes", "context", "rows"]), cfg)
    assert p.inputs["x"] == ((1, 1, 1), (7, 300, 7), (7, 300, 100))
    for name, role in DIM_ROLES.items():
        lo, _, hi = derive_profiles(_graph_with_input_dims([name]), cfg).dims[name]
        if role in FIXED_ROLES:
            assert lo == hi == {"lane_slots": 7, "cache_len": 301}[role], name
        else:
            assert (lo, hi) == (1, getattr(cfg, f"max_{role}")), name


def test_an_unknown_or_unnamed_dynamic_dim_is_refused_by_name():
    with pytest.raises(BuildError, match=r"input 'x' dim 1 is named 'seq_len', which has no role; expected one of"):
        derive_profiles(_graph_with_input_dims(["rows", "seq_len"]), BuildConfig())
    unnamed = _graph_with_input_dims(["rows", 3])
    unnamed.graph.input[0].type.tensor_type.shape.dim[1].Clear()
    with pytest.raises(BuildError, match=r"graph input 'x' dim 1 is dynamic but unnamed"):
        derive_profiles(unnamed, BuildConfig())


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_registry_graph_has_a_profile(name):
    graph = registry_graph(name)
    p = derive_profiles(graph, BuildConfig())
    for inp, (lo, mid, hi) in p.inputs.items():
        assert all(a <= b <= c for a, b, c in zip(lo, mid, hi)), inp


def test_the_verify_graph_is_built_in_fp32():
    cfg = BuildConfig(precision="bf16")
    assert precision_for("verify", cfg) == "fp32" and precision_for("decoder", cfg) == "bf16"


# -- manifests --------------------------------------------------------------------------------


def _entry(tmp_path, name="copy_model", trt="10.3.0", cc="9.0") -> EngineManifest:
    engine = tmp_path / f"{name}.engine"
    engine.write_bytes(b"serialized engine bytes of " + name.encode())
    graph = tmp_path / f"{name}.onnx"
    onnx.save(build_copy_graph(vocab=16, eos=15, max_lanes=2, max_context=8), graph)
    cfg = BuildConfig(max_rows_per_pass=8, max_lanes=2, max_context=8)
    return EngineManifest(
        name=name, engine_file=engine.name, engine_sha256=sha256_file(engine), onnx_file=str(graph),
        onnx_sha256=sha256_file(graph), tensorrt_version=trt, compute_capability=cc, gpu_name="NVIDIA H200",
        precision="fp16", io=tuple(onnx_io(graph)), profiles=(derive_profiles(graph, cfg),),
        build=dataclasses.asdict(cfg), created_utc="2026-12-02T00:00:00+00:00", meta={"eos": "15"},
    )


def test_manifest_round_trip_keeps_every_engine(tmp_path):
    a, b = _entry(tmp_path, "copy_model"), _entry(tmp_path, "verify")
    write_manifest(tmp_path, a)
    write_manifest(tmp_path, b)  # a second build adds, never drops, the first
    back = read_manifest(tmp_path)
    assert back == {"copy_model": a, "verify": b}
    assert read_manifest(tmp_path / "manifest.json") == back
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["format"] == 1 and data["engines"]["copy_model"]["engine_sha256"] == a.engine_sha256
    check_manifest(back["copy_model"], "10.3.0", (9, 0), engine_path=tmp_path / a.engine_file, onnx_path=a.onnx_file)


REFUSALS = {
    "TensorRT version": (dict(trt_version="10.4.0"), "built with TensorRT 10.3.0, running TensorRT 10.4.0"),
    "compute capability": (dict(compute_capability="8.9"), "built for compute capability 9.0 (NVIDIA H200), this GPU is 8.9"),
    "engine digest": (dict(tamper="engine"), "engine file sha256"),
    "engine missing": (dict(tamper="delete"), "is missing"),
    "ONNX changed": (dict(tamper="onnx"), "ONNX graph changed since the build"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_check_manifest_refuses_what_cannot_run_here(tmp_path, case):
    kw, text = REFUSALS[case]
    entry = _entry(tmp_path)
    engine, graph = tmp_path / entry.engine_file, Path(entry.onnx_file)
    tamper = kw.pop("tamper", None)
    if tamper == "engine":
        engine.write_bytes(b"another engine")
    elif tamper == "delete":
        engine.unlink()
    elif tamper == "onnx":
        onnx.save(build_copy_graph(vocab=17, eos=16, max_lanes=2, max_context=8), graph)
    args = {"trt_version": "10.3.0", "compute_capability": "9.0", **kw}
    with pytest.raises(ManifestError, match=r"refusing engine 'copy_model': ") as err:
        check_manifest(entry, args["trt_version"], args["compute_capability"], engine_path=engine, onnx_path=graph)
    assert text in str(err.value) and "Rebuild it here" in str(err.value)
    others = manifest_problems(entry, args["trt_version"], args["compute_capability"], engine_path=engine, onnx_path=graph)
    assert len(others) == 1, others  # exactly the one thing that is wrong


def test_a_missing_or_malformed_manifest_is_refused_clearly(tmp_path):
    with pytest.raises(ManifestError, match=r"no manifest at .*; build the engines with `sf-trt build` first"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="cannot read manifest"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 99, "engines": {}}))
    with pytest.raises(ManifestError, match="has format 99; expected format 1"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "engines": {"x": {"name": "x"}}}))
    with pytest.raises(ManifestError, match=r"manifest entry 'x' is malformed \(KeyError"):
        read_manifest(tmp_path)


# -- buffer plans ---------------------------------------------------------------------------


def test_buffer_plan_of_the_copy_model_from_its_graph():
    cfg = BuildConfig(max_rows_per_pass=256, max_lanes=4, max_context=128)
    plan = BufferPlan.from_onnx(registry_graph("copy_model"), cfg, name="copy_model")
    assert [(b.name, b.mode, b.dtype, b.shape) for b in plan.buffers] == [
        ("history", "input", "int64", (4, 128)),
        ("lanes", "input", "int64", (256,)),
        ("positions", "input", "int64", (256,)),
        ("logits", "output", "float32", (256, 512)),
    ]
    assert plan["logits"].nbytes == 256 * 512 * 4
    assert plan.total_bytes == 4 * 128 * 8 + 2 * 256 * 8 + 256 * 512 * 4
    assert "copy_model: " in plan.describe()


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_buffer_plan_of_every_registry_graph_covers_its_io(name):
    graph = registry_graph(name)
    plan = BufferPlan.from_onnx(graph, BuildConfig())
    assert {b.name for b in plan.buffers} == {t.name for t in onnx_io(graph)}
    assert all(b.nbytes > 0 for b in plan.buffers)


def test_buffer_plan_from_a_manifest_matches_the_graph(tmp_path):
    entry = _entry(tmp_path)
    from_manifest = BufferPlan.from_manifest(entry)
    from_graph = BufferPlan.from_onnx(entry.onnx_file, BuildConfig(max_rows_per_pass=8, max_lanes=2, max_context=8), name=entry.name)
    assert from_manifest == from_graph
    assert from_manifest.problems_with([(b.name, b.mode, b.dtype) for b in from_manifest.buffers]) == []
    drift = [("history", "input", "int32"), ("lanes", "input", "int64"), ("logits", "output", "float32"), ("extra", "output", "bool")]
    assert from_manifest.problems_with(drift) == [
        "engine lacks input 'positions'",
        "engine has unplanned output 'extra'",
        "'history' is input int32 in the engine, input int64 in the plan",
    ]


def test_buffer_plan_refuses_an_output_dim_no_input_bounds():
    io = [IOTensor("x", "input", "float32", ("rows",)), IOTensor("y", "output", "float32", ("rows", "mystery"))]
    with pytest.raises(StatusError, match=r"output 'y' dim 1 is named 'mystery', which no input's profile bounds") as err:
        BufferPlan.from_io("g", io, {"rows": 8})
    assert err.value.status == Status.UNSUPPORTED


# -- imports without TensorRT ---------------------------------------------------------------


def test_sf_trt_imports_without_tensorrt_or_torch():
    code = (
        "import sys\n"
        "for m in ('tensorrt', 'tensorrt_lean', 'torch', 'cuda'):\n"
        "    sys.modules[m] = None  # any import of them raises ImportError\n"
        "import sf_trt, sf_trt.backends, sf_trt.backends.tensorrt\n"
        "import sf_trt.export.trt_support, sf_trt.export.trt_build, sf_trt.export.trt_cli\n"
        "assert sys.modules['tensorrt'] is None and sys.modules['torch'] is None\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_without_tensorrt_the_primitives_and_the_build_refuse_clearly(tmp_path):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is importable here: the refusal path is not reachable")
    with pytest.raises(StatusError, match=r"TensorRTPrimitives: TensorRT not available: ") as err:
        TensorRTPrimitives.open(tmp_path)
    assert err.value.status == Status.UNSUPPORTED
    from sf_trt.export.trt_build import build_engine

    graph = tmp_path / "copy_model.onnx"
    onnx.save(build_copy_graph(vocab=16, eos=15, max_lanes=2, max_context=8), graph)
    with pytest.raises(BuildError, match=r"^TensorRT not available: "):
        build_engine(graph, BuildConfig(max_rows_per_pass=8, max_lanes=2, max_context=8), tmp_path / "engines")
    assert not (tmp_path / "engines").exists()


def test_build_refuses_an_unsupported_graph_before_touching_tensorrt(tmp_path):
    from sf_trt.export.trt_build import build_engine

    x = h.make_tensor_value_info("x", T.INT64, ["rows"])
    y = h.make_tensor_value_info("y", T.INT64, ["rows"])
    bad = h.make_model(
        h.make_graph([h.make_node("BitShift", ["x", "x"], ["y"], name="shift", direction="LEFT")], "g", [x], [y]),
        opset_imports=[h.make_opsetid("", 17)],
    )
    onnx.save(bad, tmp_path / "bad.onnx")
    with pytest.raises(BuildError, match=r"would refuse 1 node\(s\):\n  error: shift \(BitShift\)"):
        build_engine(tmp_path / "bad.onnx", BuildConfig(), tmp_path / "engines")


def test_backend_registry_imports_lazily_and_lists_what_exists():
    assert BACKENDS["tensorrt"] == "sf_trt.backends.tensorrt:TensorRTPrimitives.open"
    with pytest.raises(StatusError, match=r"create\('cuda-magic'\): unknown backend \(known: .*tensorrt"):
        create("cuda-magic")
    if importlib.util.find_spec("tensorrt") is None:
        with pytest.raises(StatusError, match="TensorRT not available"):
            create("tensorrt", engine_dir="engines")


# -- the pass logic, with onnxruntime standing in for the engines --------------------------------


SAMPLE_INPUTS = [(f.name, f.type) for f in dataclasses.fields(SampleRows)]
SAMPLE_DTYPES = {"mode": T.INT64, "temperature": T.FLOAT, "top_p": T.FLOAT, "top_k": T.INT64, "rng_key": T.INT64, "position": T.INT64, "draft": T.INT64}


def greedy_verify_graph(vocab: int) -> onnx.ModelProto:
    """A greedy-only verify graph with the verify graph's I/O (the real one may not exist yet)."""
    inputs = [h.make_tensor_value_info("logits", T.FLOAT, ["rows", vocab])]
    inputs += [h.make_tensor_value_info(n, SAMPLE_DTYPES[n], ["rows"]) for n, _ in SAMPLE_INPUTS]
    nodes = [
        h.make_node("ArgMax", ["logits"], ["tokens"], axis=1, keepdims=0, select_last_index=0),
        h.make_node("Equal", ["tokens", "draft"], ["match"]),
    ]
    outputs = [h.make_tensor_value_info("tokens", T.INT64, ["rows"]), h.make_tensor_value_info("match", T.BOOL, ["rows"])]
    return h.make_model(h.make_graph(nodes, "verify", inputs, outputs), opset_imports=[h.make_opsetid("", 17)])


def verify_graph(vocab: int, top_k_limit: int) -> onnx.ModelProto:
    if importlib.util.find_spec("sf_trt.export.verify") is None:
        return greedy_verify_graph(vocab)
    from sf_trt.export.verify import build_verify_graph

    return build_verify_graph(vocab=vocab, top_k_limit=top_k_limit)


VOCAB, EOS, LANES, CONTEXT, ROWS = 64, 63, 4, 64, 32


def stand_in(**kw) -> TensorRTPrimitives:
    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT, copy_miss_every=5)
    return TensorRTPrimitives.stand_in(copy, verify_graph(VOCAB, 16), max_rows_per_pass=ROWS, eos=EOS, top_k_limit=16, **kw)


def test_stand_in_capabilities_come_from_the_engines():
    p = stand_in()
    c = p.capabilities
    assert (c.vocab, c.eos, c.max_lanes, c.max_context, c.max_rows_per_pass, c.top_k_limit) == (VOCAB, EOS, LANES, CONTEXT, ROWS, 16)
    assert c.verify_rows and c.truncate_partial


def _rows(lanes, positions, tokens, logit_rows):
    return Rows(*(np.asarray(a, np.int64) for a in (lanes, positions, tokens, logit_rows)))


def test_stand_in_forward_is_the_copy_model_over_the_lane_state():
    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT, copy_miss_every=5)
    import onnxruntime as ort

    ref = ort.InferenceSession(copy.SerializeToString(), providers=["CPUExecutionProvider"])
    p = stand_in()
    history = np.zeros((LANES, CONTEXT), np.int64)
    tokens = [5, 6, 7, 5, 6]
    out = p.forward(_rows([2] * 5, range(5), tokens, [0, 2, 4]))
    history[2, :5] = tokens
    (want,) = ref.run(None, {"history": history, "lanes": np.array([2, 2, 2]), "positions": np.array([0, 2, 4])})
    np.testing.assert_array_equal(p.logits_host(out), want)
    # rollback by length: the lane's tail is rewritten by the next pass at the truncated position
    p.truncate(2, 3)
    out = p.forward(_rows([2], [3], [9], [0]))
    history[2, 3] = 9
    (want,) = ref.run(None, {"history": history, "lanes": np.array([2]), "positions": np.array([3])})
    np.testing.assert_array_equal(p.logits_host(out), want)
    assert p.state_len(2) == 4
    assert p.logits_host(p.forward(_rows([2], [4], [1], []))).shape == (0, VOCAB)


def test_stand_in_verify_draws_and_matches():
    p = stand_in()
    logits = p.forward(_rows([0, 0, 0], [0, 1, 2], [3, 4, 3], [0, 1, 2]))
    host = p.logits_host(logits)
    k = 3
    sample = SampleRows(
        mode=np.full(k, int(Sampling.GPU_GREEDY), np.int64), temperature=np.ones(k, np.float32),
        top_p=np.ones(k, np.float32), top_k=np.zeros(k, np.int64), rng_key=np.zeros(k, np.int64),
        position=np.arange(1, 4, dtype=np.int64), draft=np.array([int(host[0].argmax()), -1, 0], np.int64),
    )
    tokens, match = p.verify_sample(logits, sample)
    np.testing.assert_array_equal(tokens, host.argmax(axis=1))
    np.testing.assert_array_equal(match, tokens == sample.draft)
    empty = p.verify_sample(p.forward(_rows([], [], [], [])), SampleRows.empty())
    assert empty[0].shape == (0,) and empty[1].shape == (0,)


def test_stand_in_refusals_happen_at_the_seam_and_change_nothing():
    p = stand_in()
    p.forward(_rows([1, 1], [0, 1], [3, 4], [1]))
    with pytest.raises(StatusError, match=r"lane 1 row at position 5, expected 2") as err:
        p.forward(_rows([1], [5], [3], [0]))
    assert err.value.status == Status.BAD_ARGUMENT and p.state_len(1) == 2
    with pytest.raises(StatusError, match="token outside 0..63"):
        p.forward(_rows([1], [2], [VOCAB], [0]))
    with pytest.raises(StatusError, match=r"33 rows exceed max_rows_per_pass 32"):
        p.forward(_rows([0] * 33, range(33), [1] * 33, []))


def test_stand_in_refuses_a_verify_engine_with_other_inputs():
    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT)
    wrong = greedy_verify_graph(VOCAB)
    wrong.graph.input[1].name = "sampling_mode"
    wrong.graph.node[0].input[0] = "logits"
    with pytest.raises(StatusError, match=r"verify engine 'verify' inputs .*'sampling_mode'.*; expected .*'mode'"):
        TensorRTPrimitives.stand_in(copy, wrong, max_rows_per_pass=ROWS, eos=EOS, top_k_limit=16)


def test_stand_in_speculation_changes_nothing_a_plain_decode_draws():
    from sf_trt.executor import Executor, ExecutorConfig
    from sf_trt.testing import Harness, register_prompt_lookup_with

    def run(speculate: bool, mode: Sampling, params: SamplingParams) -> list[int]:
        h_ = Harness.with_engine(Executor(stand_in(), ExecutorConfig()))
        slot = register_prompt_lookup_with(h_, bytes([1]) * 32, bytes([2]) * 32, 0)[0] if speculate else 0
        prompt = [10, 11, 12, 13, 10, 11, 12]
        pid = h_.prompt(prompt)
        ev = h_.tick_ok(
            h_.plan().admit(1, pid, strategy_slot=slot, sampling=mode, params=params, rng_counter_base=77)
            .prefill(1, 0, len(prompt)).decode(1, 12)
        )
        tokens = h_.rings_tokens(ev.emit_for(1).token_ref)
        for _ in range(2):
            tokens += h_.rings_tokens(h_.tick_ok(h_.plan().decode(1, 12)).emit_for(1).token_ref)
        return tokens

    modes = [(Sampling.GPU_GREEDY, SamplingParams(flags=SamplingFlag.IGNORE_EOS))]
    if importlib.util.find_spec("sf_trt.export.verify") is not None:
        modes.append((Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)))
    for mode, params in modes:
        plain = run(False, mode, params)
        assert len(plain) == 36
        assert run(True, mode, params) == plain, mode.name


# -- on a machine with TensorRT and a GPU ------------------------------------------------------------


def _need_tensorrt_and_gpu():
    if importlib.util.find_spec("tensorrt") is None:
        pytest.skip("TensorRT is not installed (pip install tensorrt from NVIDIA's index, on a GPU machine)")
    from sf_trt.export.trt_build import device_info

    try:
        device_info()
    except BuildError as exc:
        pytest.skip(f"no usable CUDA GPU: {exc}")


@pytest.mark.tensorrt
def test_tensorrt_build_writes_an_engine_its_manifest_accepts(tmp_path):
    _need_tensorrt_and_gpu()
    import tensorrt as trt

    from sf_trt.export.trt_build import build_engine, device_info

    graph = tmp_path / "copy_model.onnx"
    onnx.save(build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT), graph)
    cfg = BuildConfig(precision="fp16", max_rows_per_pass=ROWS, max_lanes=LANES, max_context=CONTEXT, timing_cache=str(tmp_path / "timing.cache"))
    entry = build_engine(graph, cfg, tmp_path / "engines", log=lambda s: None)
    assert read_manifest(tmp_path / "engines")["copy_model"] == entry
    check_manifest(entry, trt.__version__, device_info()[0], engine_path=tmp_path / "engines" / entry.engine_file)
    assert (tmp_path / "timing.cache").stat().st_size > 0
    assert BufferPlan.from_manifest(entry) == BufferPlan.from_onnx(graph, cfg, name="copy_model")


@pytest.mark.tensorrt
def test_tensorrt_fake_matches_the_stand_in(tmp_path):
    _need_tensorrt_and_gpu()
    from sf_trt.export.trt_build import build_engine

    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT, copy_miss_every=5)
    onnx.save(copy, tmp_path / "copy_model.onnx")
    onnx.save(verify_graph(VOCAB, 16), tmp_path / "verify.onnx")
    cfg = BuildConfig(max_rows_per_pass=ROWS, max_lanes=LANES, max_context=CONTEXT)
    for name in ("copy_model", "verify"):
        build_engine(tmp_path / f"{name}.onnx", cfg, tmp_path / "engines", log=lambda s: None)
    for graphs in (False, True):
        trt_p = TensorRTPrimitives.open(tmp_path / "engines", eos=EOS, top_k_limit=16, cuda_graphs=graphs)
        cpu_p = stand_in()
        for rows in (_rows([0, 0, 0], [0, 1, 2], [3, 4, 3], [0, 1, 2]), _rows([0, 1], [3, 0], [4, 9], [0, 1]), _rows([0, 1], [4, 1], [5, 2], [0, 1])):
            got, want = trt_p.forward(rows), cpu_p.forward(rows)
            np.testing.assert_array_equal(trt_p.logits_host(got), cpu_p.logits_host(want))
        trt_p.close()



def _smoke():
    spec = importlib.util.spec_from_file_location("trt_smoke", ROOT / "tools" / "trt_smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    return smoke


def test_the_seed_contract_passes_on_the_stand_in_fake():
    """What tools/trt_smoke.py runs on the TensorRT fake, with onnxruntime standing in."""
    smoke = _smoke()
    assert smoke.seed_contract(smoke.stand_in_fake, "the stand-in").startswith("6 seed tests pass")


def test_speculative_equals_plain_on_the_stand_in_fake():
    smoke = _smoke()
    assert "speculative == plain" in smoke.speculative_equals_plain(smoke.stand_in_fake)


# -- the decoder path, with onnxruntime standing in ------------------------------------------------


def _decoder_parts():
    if importlib.util.find_spec("sf_trt.export.decoder") is None:
        pytest.skip("export/decoder.py is not written yet")
    from sf_trt.export.decoder import build_decoder_graph, random_llama_weights, tiny_llama_config

    cfg = tiny_llama_config()
    weights = random_llama_weights(cfg, seed=0)
    # Symbolic caches (as export_model_dir writes them), sized by the stand-in like a build would.
    return cfg, weights, build_decoder_graph(cfg, weights)


def decoder_stand_in(**kw) -> TensorRTPrimitives:
    cfg, _, graph = _decoder_parts()
    return TensorRTPrimitives.stand_in(
        graph, verify_graph(cfg.vocab, 16), max_rows_per_pass=24, eos=cfg.eos, top_k_limit=16, max_lanes=3, max_context=48, **kw
    )


def test_decoder_stand_in_capabilities_come_from_the_graph():
    cfg, _, _ = _decoder_parts()
    c = decoder_stand_in().capabilities
    assert (c.vocab, c.max_lanes, c.max_context, c.max_rows_per_pass, c.eos) == (cfg.vocab, 3, 48, 24, cfg.eos)


def test_decoder_stand_in_matches_the_reference_and_any_packing():
    from sf_trt.export.decoder import reference_forward

    cfg, weights, _ = _decoder_parts()
    tokens = [5, 9, 17, 3, 5, 9, 40, 41, 2, 7]
    want = reference_forward(cfg, weights, tokens)  # float64 [10, vocab]
    # one lane, prefilled in one pass
    p = decoder_stand_in()
    whole = p.logits_host(p.forward(_rows([1] * 10, range(10), tokens, range(10))))
    np.testing.assert_allclose(whole, want, atol=1e-4, rtol=1e-4)
    # the same lane packed otherwise: chunks of 3, beside two other lanes, its rows among theirs
    q = decoder_stand_in()
    got = []
    for start in range(0, 10, 3):
        n = min(3, 10 - start)
        lanes = [0, 0] + [1] * n + [2]
        positions = [2 * start // 3, 2 * start // 3 + 1] + list(range(start, start + n)) + [start // 3]
        toks = [11, 12] + tokens[start:start + n] + [13]
        out = q.logits_host(q.forward(_rows(lanes, positions, toks, range(2, 2 + n))))
        got.append(out)
    np.testing.assert_array_equal(np.concatenate(got), whole)  # bit for bit: rows do not depend on the pass


def test_decoder_stand_in_rolls_back_by_length():
    p = decoder_stand_in()
    p.forward(_rows([0] * 6, range(6), [1, 2, 3, 4, 5, 6], []))
    ref = p.logits_host(p.forward(_rows([0], [6], [7], [0])))
    p.forward(_rows([0, 0], [7, 8], [50, 51], [1]))  # a draft, then rejected:
    p.truncate(0, 6)
    again = p.logits_host(p.forward(_rows([0], [6], [7], [0])))
    np.testing.assert_array_equal(again, ref)


def test_decoder_stand_in_speculation_changes_nothing_a_plain_decode_draws():
    from sf_trt.executor import Executor, ExecutorConfig
    from sf_trt.testing import Harness, register_prompt_lookup_with

    def run(speculate: bool, mode: Sampling, params: SamplingParams) -> list[list[int]]:
        h_ = Harness.with_engine(Executor(decoder_stand_in(), ExecutorConfig()))
        slot = register_prompt_lookup_with(h_, bytes([1]) * 32, bytes([2]) * 32, 0)[0] if speculate else 0
        prompts = {1: [10, 11, 12, 13, 10, 11, 12], 2: [7, 8, 7, 8, 7]}
        plan = h_.plan()
        for lane, prompt in prompts.items():
            plan = plan.admit(lane, h_.prompt(prompt), strategy_slot=slot, sampling=mode, params=params, rng_counter_base=lane)
            plan = plan.prefill(lane, 0, len(prompt)).decode(lane, 6)
        ev = h_.tick_ok(plan)
        out = {lane: h_.rings_tokens(ev.emit_for(lane).token_ref) for lane in prompts}
        ev = h_.tick_ok(h_.plan().decode(1, 6).decode(2, 6))
        return [out[lane] + h_.rings_tokens(ev.emit_for(lane).token_ref) for lane in prompts]

    for mode, params in (
        (Sampling.GPU_GREEDY, SamplingParams(flags=SamplingFlag.IGNORE_EOS)),
        (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)),
    ):
        plain = run(False, mode, params)
        assert [len(t) for t in plain] == [12, 12]
        assert run(True, mode, params) == plain, mode.name


def test_decoder_speculation_check_of_the_smoke_tool_on_the_stand_in():
    _decoder_parts()
    smoke = _smoke()
    detail = smoke.speculative_equals_plain(lambda cfg: smoke.decoder_stand_in(), lanes=2, vocab=256, per_tick=12)
    assert "speculative == plain" in detail


@pytest.mark.tensorrt
def test_tensorrt_decoder_matches_the_stand_in_within_fp16_tolerance(tmp_path):
    _need_tensorrt_and_gpu()
    from sf_trt.export.trt_build import build_engine

    cfg, _, graph = _decoder_parts()
    onnx.save(graph, tmp_path / "decoder.onnx")
    onnx.save(verify_graph(cfg.vocab, 16), tmp_path / "verify.onnx")
    build = BuildConfig(precision="fp16", max_rows_per_pass=24, max_lanes=3, max_context=48)
    for name in ("decoder", "verify"):
        build_engine(tmp_path / f"{name}.onnx", build, tmp_path / "engines", log=lambda s: None)
    for graphs in (False, True):
        trt_p = TensorRTPrimitives.open(tmp_path / "engines", model="decoder", eos=cfg.eos, cuda_graphs=graphs)
        cpu_p = decoder_stand_in()
        for rows in (_rows([0] * 6, range(6), [5, 9, 17, 3, 5, 9], range(6)), _rows([0, 2], [6, 0], [4, 8], [0, 1]), _rows([0, 2], [7, 1], [1, 2], [0, 1])):
            np.testing.assert_allclose(trt_p.logits_host(trt_p.forward(rows)), cpu_p.logits_host(cpu_p.forward(rows)), atol=2e-2, rtol=2e-2)
        trt_p.close()

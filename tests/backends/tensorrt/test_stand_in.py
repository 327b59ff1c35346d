"""The TensorRT primitives' pass logic with onnxruntime standing in for the engines, and on real engines where a GPU is.

Every engine takes one shape; the primitives pad each pass to it and split what does not
fit. The stand-in runs the engines' own graphs at exactly those shapes (an OrtRunner refuses
any other), so padding, splitting and the write-back of K/V are what is tested here; the
checks of tools/trt_device_check.py run here on the stand-in, and on engines with
``-m tensorrt``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from sf_trt.export.trt_config import BuildConfig

from sf_trt.abi import Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.backends.tensorrt import TensorRTError, TensorRTPrimitives
from sf_trt.formats.shapes import ShapeLimits
from sf_trt.graphs.copy_model import build_copy_graph
from sf_trt.graphs.verify import build_greedy_graph, build_verify_graph, sample_feeds
from sf_trt.primitives import Rows, SampleRows

ROOT = Path(__file__).resolve().parents[3]

VOCAB, EOS, LANES, CONTEXT, ROWS = 64, 63, 4, 64, 32
COPY_SHAPES = ShapeLimits(max_lanes=LANES, rows_per_lane=ROWS // LANES, max_context=CONTEXT)


def _tool():
    spec = importlib.util.spec_from_file_location("trt_device_check", ROOT / "tools" / "trt_device_check.py")
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool  # its dataclasses look their module up
    spec.loader.exec_module(tool)
    return tool


check = _tool()


def stand_in(shapes: ShapeLimits = COPY_SHAPES, **kw) -> TensorRTPrimitives:
    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT, copy_miss_every=5)
    return TensorRTPrimitives.stand_in(copy, build_verify_graph(VOCAB, 16), shapes, eos=EOS, top_k_limit=16, **kw)


def _rows(lanes, positions, tokens, logit_rows):
    return Rows(*(np.asarray(a, np.int64) for a in (lanes, positions, tokens, logit_rows)))


def test_stand_in_capabilities_come_from_the_engines():
    p = stand_in()
    c = p.capabilities
    assert (c.vocab, c.eos, c.max_lanes, c.max_context, c.max_rows_per_pass, c.top_k_limit) == (VOCAB, EOS, LANES, CONTEXT, ROWS, 16)
    assert c.verify_rows and c.truncate_partial
    assert stand_in(max_rows_per_pass=100).capabilities.max_rows_per_pass == 100  # more rows than a run: several runs


def test_stand_in_forward_is_the_copy_model_over_the_lane_state():
    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT, copy_miss_every=5)
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


def test_a_copy_model_pass_of_more_logit_rows_than_a_run_is_split_into_runs():
    """Runs of 8 rows: a 21-row pass is three runs (8, 8, 5 padded to 8); the logits are the graph's."""
    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT, copy_miss_every=5)
    ref = ort.InferenceSession(copy.SerializeToString(), providers=["CPUExecutionProvider"])
    p = stand_in(ShapeLimits(max_lanes=LANES, rows_per_lane=2, max_context=CONTEXT), max_rows_per_pass=64)
    tokens = np.random.default_rng(1).integers(0, VOCAB, 21)
    out = p.logits_host(p.forward(_rows([1] * 21, range(21), tokens, range(21))))
    history = np.zeros((LANES, CONTEXT), np.int64)
    history[1, :21] = tokens
    (want,) = ref.run(None, {"history": history, "lanes": np.ones(21, np.int64), "positions": np.arange(21)})
    np.testing.assert_array_equal(out, want)


def test_stand_in_verify_draws_and_matches():
    p = stand_in()
    logits = p.forward(_rows([0, 0, 0], [0, 1, 2], [3, 4, 3], [0, 1, 2]))
    host = p.logits_host(logits)
    k = 3
    sample = SampleRows(
        mode=np.full(k, int(Sampling.GPU_GREEDY), np.int64), temperature=np.ones(k, np.float32),
        top_p=np.ones(k, np.float32), top_k=np.zeros(k, np.int64), rng_counter_base=np.zeros(k, np.int64),
        position=np.arange(1, 4, dtype=np.int64), draft=np.array([int(host[0].argmax()), -1, 0], np.int64),
    )
    tokens, match = p.verify_sample(logits, sample)
    np.testing.assert_array_equal(tokens, host.argmax(axis=1))
    np.testing.assert_array_equal(match, tokens == sample.draft)
    empty = p.verify_sample(p.forward(_rows([], [], [], [])), SampleRows.empty())
    assert empty[0].shape == (0,) and empty[1].shape == (0,)


def test_verify_runs_are_padded_and_split_and_draw_what_the_graph_draws_unpadded():
    """Verify runs of 8 rows: 19 Gumbel rows are three runs; each row draws what the verify graph,
    run on all 19 rows at once, draws (rows never mix, padding rows never leak)."""
    p = stand_in(ShapeLimits(max_lanes=LANES, rows_per_lane=2, max_context=CONTEXT), max_rows_per_pass=64)
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (19, VOCAB)).astype(np.float32)
    sample = check.sample_rows(19, rng.integers(0, 2**62, 19), rng.integers(0, 2**31, 19), top_k=5)
    tokens, match = p.verify_sample(logits, sample)
    graph = ort.InferenceSession(build_verify_graph(VOCAB, 16).SerializeToString(), providers=["CPUExecutionProvider"])
    want, want_match = graph.run(None, {"logits": logits, **sample_feeds(sample)})
    np.testing.assert_array_equal(tokens, want)
    np.testing.assert_array_equal(match, want_match)


def test_an_engine_run_at_another_shape_is_refused():
    """The stand-in's runner takes only the engine's one shape, as an engine would."""
    p = stand_in()
    with pytest.raises(TensorRTError, match=r"verify: inputs \{'logits': \(3, 64\)\} do not have the engine's one shape \[\(32, 64\)\]"):
        p._verify.run({"logits": np.zeros((3, VOCAB), np.float32)})


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
    wrong = build_greedy_graph(VOCAB)
    wrong.graph.input[1].name = "sampling_mode"
    wrong.graph.node[0].input[0] = "logits"
    with pytest.raises(StatusError, match=r"verify engine 'verify' inputs .*'sampling_mode'.*; expected .*'mode'"):
        TensorRTPrimitives.stand_in(copy, wrong, COPY_SHAPES, eos=EOS, top_k_limit=16)


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

    modes = [
        (Sampling.GPU_GREEDY, SamplingParams(flags=SamplingFlag.IGNORE_EOS)),
        (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)),
    ]
    for mode, params in modes:
        plain = run(False, mode, params)
        assert len(plain) == 36
        assert run(True, mode, params) == plain, mode.name


def test_the_seed_contract_passes_on_the_stand_in_fake():
    """What tools/trt_device_check.py (g) runs on the TensorRT fake, with onnxruntime standing in."""
    assert check.seed_contract(check.stand_in_fake, "the stand-in").startswith("6 seed tests pass")


def test_speculative_equals_plain_on_the_stand_in_fake():
    assert "speculative == plain" in check.speculative_equals_plain(check.stand_in_fake, check.SPEC_PROMPTS)


# -- the decoder ---------------------------------------------------------------------------


def _decoder_parts(precision: str = "fp32"):
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

    cfg = tiny_llama_config()
    weights = random_llama_weights(cfg, seed=0)
    # Symbolic caches (as export_model_dir writes them), sized by the stand-in like a build would.
    return cfg, weights, build_decoder_graph(cfg, weights, precision=precision)


DECODER_SHAPES = ShapeLimits(max_lanes=3, rows_per_lane=4, max_context=48)


def decoder_stand_in(shapes: ShapeLimits = DECODER_SHAPES, precision: str = "fp32", **kw) -> TensorRTPrimitives:
    cfg, _, graph = _decoder_parts(precision)
    return TensorRTPrimitives.stand_in(graph, build_verify_graph(cfg.vocab, 16), shapes, eos=cfg.eos, top_k_limit=16, **kw)


def test_decoder_stand_in_capabilities_come_from_the_graph():
    cfg, _, _ = _decoder_parts()
    c = decoder_stand_in(max_rows_per_pass=24).capabilities
    assert (c.vocab, c.max_lanes, c.max_context, c.max_rows_per_pass, c.eos) == (cfg.vocab, 3, 48, 24, cfg.eos)
    assert decoder_stand_in().capabilities.max_rows_per_pass == 12  # by default one run: 3 lanes x 4 rows


def test_decoder_stand_in_matches_the_reference_and_any_packing():
    """Lane 1's ten rows in one pass (three runs of 4 rows), then in chunks of 3 beside two
    other lanes: the float64 reference's logits, and bit for bit the same both ways."""
    from sf_trt.export.reference import reference_forward

    cfg, weights, _ = _decoder_parts()
    tokens = [5, 9, 17, 3, 5, 9, 40, 41, 2, 7]
    want = reference_forward(cfg, weights, tokens)  # float64 [10, vocab]
    p = decoder_stand_in(max_rows_per_pass=24)
    whole = p.logits_host(p.forward(_rows([1] * 10, range(10), tokens, range(10))))
    np.testing.assert_allclose(whole, want, atol=1e-4, rtol=1e-4)
    q = decoder_stand_in(max_rows_per_pass=24)
    got = []
    for start in range(0, 10, 3):
        n = min(3, 10 - start)
        lanes = [0, 0] + [1] * n + [2]
        positions = [2 * start // 3, 2 * start // 3 + 1] + list(range(start, start + n)) + [start // 3]
        toks = [11, 12] + tokens[start:start + n] + [13]
        got.append(q.logits_host(q.forward(_rows(lanes, positions, toks, range(2, 2 + n)))))
    np.testing.assert_array_equal(np.concatenate(got), whole)  # bit for bit: rows do not depend on the pass


def test_decoder_logit_rows_named_twice_and_out_of_order_across_runs():
    p = decoder_stand_in(max_rows_per_pass=24)
    tokens = [5, 9, 17, 3, 5, 9, 40]
    ref = p.logits_host(p.forward(_rows([0] * 7, range(7), tokens, range(7))))
    q = decoder_stand_in(max_rows_per_pass=24)
    got = q.logits_host(q.forward(_rows([0] * 7, range(7), tokens, [6, 1, 1, 5, 0])))
    np.testing.assert_array_equal(got, ref[[6, 1, 1, 5, 0]])


def test_decoder_stand_in_rolls_back_by_length():
    p = decoder_stand_in()
    p.forward(_rows([0] * 6, range(6), [1, 2, 3, 4, 5, 6], []))
    ref = p.logits_host(p.forward(_rows([0], [6], [7], [0])))
    p.forward(_rows([0, 0], [7, 8], [50, 51], [1]))  # a draft, then rejected:
    p.truncate(0, 6)
    again = p.logits_host(p.forward(_rows([0], [6], [7], [0])))
    np.testing.assert_array_equal(again, ref)


@pytest.mark.parametrize("rows_per_lane", [1, 3, 16])
def test_decoder_stand_in_speculation_changes_nothing_a_plain_decode_draws(rows_per_lane):
    """Verify passes of 1 + 8 draft rows fit one run (16), span three (3), or nine (1)."""
    from sf_trt.executor import Executor, ExecutorConfig
    from sf_trt.testing import Harness, register_prompt_lookup_with

    shapes = ShapeLimits(max_lanes=3, rows_per_lane=rows_per_lane, max_context=48)

    def run(speculate: bool, mode: Sampling, params: SamplingParams) -> list[list[int]]:
        h_ = Harness.with_engine(Executor(decoder_stand_in(shapes, max_rows_per_pass=32), ExecutorConfig()))
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


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("rows_per_lane", [8, 2])
def test_the_device_checks_packing_passes_on_the_stand_in(precision, rows_per_lane):
    """(c) of tools/trt_device_check.py: a lane alone (one row a pass) vs packed beside three
    lanes at another slot, in chunks that fit a run (8) or span runs (2); logits and draws bit for bit."""
    cfg, _, graph = _decoder_parts(precision)
    shapes = ShapeLimits(max_lanes=4, rows_per_lane=rows_per_lane, max_context=64)
    make = lambda: TensorRTPrimitives.stand_in(graph, build_verify_graph(cfg.vocab, 16), shapes, eos=cfg.eos, top_k_limit=16, max_rows_per_pass=32)  # noqa: E731
    assert "bit for bit" in check.packing(make, cfg.vocab)


def test_the_device_checks_replay_and_speculation_pass_on_the_stand_in():
    """(e) and the decoder's speculation on the stand-in: the comparisons themselves (a CUDA graph
    needs a GPU; here both runs are plain, the replayed one claiming its graphs were captured;
    tests/backends/tensorrt/test_device_check.py shows (e) failing when they were not)."""

    def make(graphs: bool):
        p = check.tiny_stand_in("fp16")
        if graphs:
            p.graphs_captured = lambda: {"model": True, "verify": True}
        return p

    assert "bit for bit" in check.replay_equals_eager(make, 256)
    detail = check.speculative_equals_plain(lambda cfg: check.tiny_stand_in(), [[t % 256 for t in p] for p in check.SPEC_PROMPTS], per_tick=12)
    assert "speculative == plain" in detail


def test_the_device_checks_verify_check_passes_on_onnxruntime():
    """(b) of tools/trt_device_check.py with onnxruntime running the two verify graphs at the engine's shape."""
    from sf_trt.backends.tensorrt.buffers import BufferPlan
    from sf_trt.backends.tensorrt.runners import OrtRunner

    dims = {"rows": 64}
    runners = [
        OrtRunner(name, g, BufferPlan.from_onnx(g, name=name, dims=dims))
        for name, g in (("debug", build_verify_graph(check.VERIFY_VOCAB, check.VERIFY_TOP_K, debug=True)), ("verify", build_verify_graph(check.VERIFY_VOCAB, check.VERIFY_TOP_K)))
    ]
    detail = check.verify_against_reference(runners[0].run, runners[1].run, 64, check.VERIFY_VOCAB, check.VERIFY_TOP_K)
    assert "u == hash_u bit for bit" in detail


# -- on a GPU: pytest -m tensorrt -------------------------------------------------------------


def _need_tensorrt_and_gpu():
    if importlib.util.find_spec("tensorrt") is None:
        pytest.skip("TensorRT is not installed (pip install tensorrt from NVIDIA's index, on a GPU machine)")
    try:
        return check.environment()[0]
    except check.Missing as exc:
        pytest.skip(str(exc))


@pytest.mark.tensorrt
def test_tensorrt_fake_matches_the_stand_in(tmp_path):
    _need_tensorrt_and_gpu()
    from sf_trt.export.trt_build import build_engine

    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT, copy_miss_every=5)
    onnx.save(copy, tmp_path / "copy_model.onnx")
    onnx.save(build_verify_graph(VOCAB, 16), tmp_path / "verify.onnx")
    cfg = BuildConfig(max_lanes=LANES, rows_per_lane=ROWS // LANES, max_context=CONTEXT)
    for name in ("copy_model", "verify"):
        build_engine(tmp_path / f"{name}.onnx", cfg, tmp_path / "engines", log=lambda s: None)
    for graphs in (False, True):
        trt_p = TensorRTPrimitives.open(tmp_path / "engines", eos=EOS, top_k_limit=16, cuda_graphs=graphs)
        cpu_p = stand_in()
        for rows in (_rows([0, 0, 0], [0, 1, 2], [3, 4, 3], [0, 1, 2]), _rows([0, 1], [3, 0], [4, 9], [0, 1]), _rows([0, 1], [4, 1], [5, 2], [0, 1])):
            got, want = trt_p.forward(rows), cpu_p.forward(rows)
            np.testing.assert_array_equal(trt_p.logits_host(got), cpu_p.logits_host(want))
        assert trt_p.graphs_captured()["copy_model"] == graphs  # a capture that fell back would say False
        trt_p.close()


@pytest.mark.tensorrt
def test_tensorrt_verify_engine_draws_the_reference_bit_for_bit(tmp_path):
    """(b): the verify engine's u is hash_u and its tokens the reference's, bit for bit."""
    trt = _need_tensorrt_and_gpu()
    engines = check.Engines(tmp_path, trt.__version__)
    shapes = dict(max_lanes=8, rows_per_lane=8, max_context=1)
    debug = engines.build("verify_debug", build_verify_graph(check.VERIFY_VOCAB, check.VERIFY_TOP_K, debug=True), shapes)
    plain = engines.build("verify", build_verify_graph(check.VERIFY_VOCAB, check.VERIFY_TOP_K), shapes)
    check.verify_against_reference(check.trt_runner(trt, debug, "verify_debug")[1], check.trt_runner(trt, plain, "verify")[1], 64, check.VERIFY_VOCAB, check.VERIFY_TOP_K)


@pytest.mark.tensorrt
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_rows_are_bit_identical_alone_and_packed(tmp_path, precision):
    """(c): a lane's rows alone and inside wider passes, decoder logits and verify tokens bit for bit."""
    trt = _need_tensorrt_and_gpu()
    cfg, engine_dir = check.tiny_engines(check.Engines(tmp_path, trt.__version__), precision)
    check.packing(lambda: check.trt_prims(engine_dir, "decoder", cfg.eos), cfg.vocab)


@pytest.mark.tensorrt
def test_tensorrt_fp16_decoder_is_close_to_the_fp32_stand_in(tmp_path):
    trt = _need_tensorrt_and_gpu()
    cfg, engine_dir = check.tiny_engines(check.Engines(tmp_path, trt.__version__), "fp16")
    for graphs in (False, True):
        trt_p = check.trt_prims(engine_dir, "decoder", cfg.eos, cuda_graphs=graphs)
        cpu_p = check.tiny_stand_in("fp32")
        for rows in (_rows([0] * 6, range(6), [5, 9, 17, 3, 5, 9], range(6)), _rows([0, 2], [6, 0], [4, 8], [0, 1]), _rows([0, 2], [7, 1], [1, 2], [0, 1])):
            np.testing.assert_allclose(trt_p.logits_host(trt_p.forward(rows)), cpu_p.logits_host(cpu_p.forward(rows)), atol=2e-2, rtol=2e-2)
        trt_p.close()


def test_tensorrt_says_it_cannot_hold_a_prefix_cache():
    """Until copying blocks of device state in and out is measured against recomputing them."""
    from sf_trt.executor import Executor, ExecutorConfig

    p = stand_in()
    assert p.capabilities.state_bytes_per_token == 0
    with pytest.raises(StatusError, match=r"Executor: prefix_cache_mb 64 asks for a prefix cache, and TensorRTPrimitives cannot save or load state") as err:
        Executor(p, ExecutorConfig(prefix_cache_mb=64))
    assert err.value.status == Status.UNSUPPORTED
    with pytest.raises(StatusError, match=r"load_prefix\(lane=0, 0 blocks\): TensorRTPrimitives cannot save or load state") as err:
        p.load_prefix(0, [])
    assert err.value.status == Status.UNSUPPORTED


def test_penalized_lanes_on_the_stand_in_draw_what_the_fake_draws():
    """The logit adjustments run before the verify engine (and on the device's copy of the
    logits); a speculating lane with penalties emits what the same lane emits plain."""
    import functools

    from lanes import LaneSpec, plain_alone, run_lanes

    params = SamplingParams(temperature=0.8, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2,
                            logit_bias={5: 2.0}, min_tokens=4, max_tokens=20)
    for mode in (Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL):
        spec = LaneSpec(prompt=(1, 2, 3, 1, 2, 3, 1, 2), mode=mode, params=params, speculate=True, seed=9, budgets=(7, 13))
        (run,) = run_lanes(functools.partial(stand_in), [spec])
        assert run.tokens == plain_alone(functools.partial(stand_in), spec).tokens and len(run.tokens) == 20

"""The TensorRT primitives' pass logic with onnxruntime standing in for the engines, and on real engines where a GPU is."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from sf_trt.export.trt_config import BuildConfig

from sf_trt.abi import Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.backends.tensorrt import TensorRTPrimitives
from sf_trt.graphs.copy_model import build_copy_graph
from sf_trt.graphs.verify import build_greedy_graph, build_verify_graph
from sf_trt.primitives import Rows, SampleRows

ROOT = Path(__file__).resolve().parents[3]

VOCAB, EOS, LANES, CONTEXT, ROWS = 64, 63, 4, 64, 32


def stand_in(**kw) -> TensorRTPrimitives:
    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT, copy_miss_every=5)
    return TensorRTPrimitives.stand_in(copy, build_verify_graph(VOCAB, 16), max_rows_per_pass=ROWS, eos=EOS, top_k_limit=16, **kw)


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
    wrong = build_greedy_graph(VOCAB)
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

    modes = [
        (Sampling.GPU_GREEDY, SamplingParams(flags=SamplingFlag.IGNORE_EOS)),
        (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)),
    ]
    for mode, params in modes:
        plain = run(False, mode, params)
        assert len(plain) == 36
        assert run(True, mode, params) == plain, mode.name


def _need_tensorrt_and_gpu():
    if importlib.util.find_spec("tensorrt") is None:
        pytest.skip("TensorRT is not installed (pip install tensorrt from NVIDIA's index, on a GPU machine)")
    from sf_trt.backends.tensorrt import TensorRTUnavailable
    from sf_trt.backends.tensorrt.probes import device_info

    try:
        device_info()
    except TensorRTUnavailable as exc:
        pytest.skip(f"no usable CUDA GPU: {exc}")


@pytest.mark.tensorrt
def test_tensorrt_fake_matches_the_stand_in(tmp_path):
    _need_tensorrt_and_gpu()
    from sf_trt.export.trt_build import build_engine

    copy = build_copy_graph(vocab=VOCAB, eos=EOS, max_lanes=LANES, max_context=CONTEXT, copy_miss_every=5)
    onnx.save(copy, tmp_path / "copy_model.onnx")
    onnx.save(build_verify_graph(VOCAB, 16), tmp_path / "verify.onnx")
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


def _decoder_parts():
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

    cfg = tiny_llama_config()
    weights = random_llama_weights(cfg, seed=0)
    # Symbolic caches (as export_model_dir writes them), sized by the stand-in like a build would.
    return cfg, weights, build_decoder_graph(cfg, weights)


def decoder_stand_in(**kw) -> TensorRTPrimitives:
    cfg, _, graph = _decoder_parts()
    return TensorRTPrimitives.stand_in(
        graph, build_verify_graph(cfg.vocab, 16), max_rows_per_pass=24, eos=cfg.eos, top_k_limit=16, max_lanes=3, max_context=48, **kw
    )


def test_decoder_stand_in_capabilities_come_from_the_graph():
    cfg, _, _ = _decoder_parts()
    c = decoder_stand_in().capabilities
    assert (c.vocab, c.max_lanes, c.max_context, c.max_rows_per_pass, c.eos) == (cfg.vocab, 3, 48, 24, cfg.eos)


def test_decoder_stand_in_matches_the_reference_and_any_packing():
    from sf_trt.export.reference import reference_forward

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
    onnx.save(build_verify_graph(cfg.vocab, 16), tmp_path / "verify.onnx")
    build = BuildConfig(precision="fp16", max_rows_per_pass=24, max_lanes=3, max_context=48)
    for name in ("decoder", "verify"):
        build_engine(tmp_path / f"{name}.onnx", build, tmp_path / "engines", log=lambda s: None)
    for graphs in (False, True):
        trt_p = TensorRTPrimitives.open(tmp_path / "engines", model="decoder", eos=cfg.eos, cuda_graphs=graphs)
        cpu_p = decoder_stand_in()
        for rows in (_rows([0] * 6, range(6), [5, 9, 17, 3, 5, 9], range(6)), _rows([0, 2], [6, 0], [4, 8], [0, 1]), _rows([0, 2], [7, 1], [1, 2], [0, 1])):
            np.testing.assert_allclose(trt_p.logits_host(trt_p.forward(rows)), cpu_p.logits_host(cpu_p.forward(rows)), atol=2e-2, rtol=2e-2)
        trt_p.close()

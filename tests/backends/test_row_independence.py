"""Rows of a pass are bit-identical however the pass is packed: the decoder on onnxruntime, every optimization level, tiny and real."""

from __future__ import annotations

import numpy as np
import pytest

from rows import assert_rows_exact, assert_schedules_exact, bits

from sf_trt.backends.ort_decoder import OrtDecoderPrimitives


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("optimization", ["disable", "basic", "extended", "all"])
def test_tiny_rows_are_exact_in_any_pass(tiny_model_dir, schedules, optimization, threads):
    rng = np.random.default_rng(11)
    sched = schedules({0: rng.integers(0, 256, 30), 1: rng.integers(0, 256, 22), 2: rng.integers(0, 256, 27)})
    with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=64, threads=threads, optimization=optimization) as prims:
        assert_rows_exact(prims, sched)


@pytest.mark.parametrize("optimization", ["extended", "all"])
def test_tiny_int8_rows_are_exact_in_any_pass(tiny_int8_model_dir, schedules, optimization):
    rng = np.random.default_rng(14)
    sched = schedules({0: rng.integers(0, 256, 24), 1: rng.integers(0, 256, 19), 2: rng.integers(0, 256, 21)})
    with OrtDecoderPrimitives(tiny_int8_model_dir, max_lanes=3, max_context=64, optimization=optimization) as prims:
        assert_rows_exact(prims, sched)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("optimization", ["disable", "basic", "extended", "all"])
@pytest.mark.parametrize(
    "export", ["tiny_q4_model_dir", "tiny_mixed_q4_model_dir", "tiny_mixed_gguf_model_dir", "tiny_mixed_int4_model_dir"],
    ids=["q4-requantized", "q4-mixed", "gguf", "int4"],
)
def test_tiny_q4_rows_are_exact_in_any_pass(export, schedules, optimization, threads, request):
    """MatMulNBits, int8 compute, in every form the q4 export makes: 4-bit matrices requantized
    with zero points; Q4_0, Q4_1 and Q4_K blocks carried (Q4_1's and Q4_K's offsets), mixed in one
    matrix with requantized ones; an 8-bit Q8_0 lm_head. Its one-row and many-row kernels give
    each row the same bits. And ``weights="gguf"``'s: 8 bits in blocks of 16 (Q6_K) and of 32 with
    offsets (Q5_K, Q5_1, Q4_K widened), Q5_0, Q8_0."""
    rng = np.random.default_rng(17)
    sched = schedules({0: rng.integers(0, 256, 26), 1: rng.integers(0, 256, 19), 2: rng.integers(0, 256, 23)})
    model = request.getfixturevalue(export)
    with OrtDecoderPrimitives(model, max_lanes=3, max_context=64, threads=threads, optimization=optimization) as prims:
        assert_rows_exact(prims, sched)


@pytest.mark.parametrize("threads", [1, 2])
def test_tiny_fp16_rows_are_exact_in_any_pass(tiny_fp16_model_dir, schedules, threads):
    """An fp16 decoder on onnxruntime's CPU kernels (which compute float16 by way of float32):
    rows exact at ORT_ENABLE_ALL, the only level OrtDecoderPrimitives accepts for fp16."""
    rng = np.random.default_rng(16)
    sched = schedules({0: rng.integers(0, 256, 30), 1: rng.integers(0, 256, 22), 2: rng.integers(0, 256, 27)})
    with OrtDecoderPrimitives(tiny_fp16_model_dir, max_lanes=3, max_context=64, threads=threads) as prims:
        assert_rows_exact(prims, sched)


@pytest.mark.parametrize("optimization", ["disable", "basic", "extended"])
def test_an_fp16_decoder_below_the_exact_optimization_level_is_refused(tiny_fp16_model_dir, optimization):
    from sf_trt.abi import Status, StatusError

    with pytest.raises(StatusError, match=rf"optimization '{optimization}' with an fp16 decoder: rows would not be exact \(use 'all'\)") as err:
        OrtDecoderPrimitives(tiny_fp16_model_dir, max_lanes=3, max_context=64, optimization=optimization)
    assert err.value.status == Status.BAD_ARGUMENT


@pytest.mark.parametrize("optimization", ["disable", "all"])
def test_tiny_rows_without_gqa_are_exact(tiny_mha_model_dir, schedules, optimization):
    """Without GQA a decode row's attention matmul would have M == 1, where MLAS
    differs from M > 1; the graph doubles the queries so it never does."""
    rng = np.random.default_rng(15)
    sched = schedules({0: rng.integers(0, 256, 20), 1: rng.integers(0, 256, 14), 2: rng.integers(0, 256, 17)})
    with OrtDecoderPrimitives(tiny_mha_model_dir, max_lanes=3, max_context=64, optimization=optimization) as prims:
        assert_rows_exact(prims, sched)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("optimization", ["disable", "all"])
def test_tiny_rows_are_exact_whatever_the_key_extent(tiny_model_dir, schedules, optimization, threads):
    """The pass form reads keys up to the pass's own extent (its largest position, rounded up to
    64): a row computed when that extent is 64, 128, ... or the whole window (the slots form, and
    a pass beside a lane 200 positions further on) comes out with the same bits."""
    rng = np.random.default_rng(18)
    sched = schedules({0: rng.integers(0, 256, 230), 1: rng.integers(0, 256, 140), 2: rng.integers(0, 256, 75)})
    with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=320, threads=threads, optimization=optimization) as prims:
        plain = assert_schedules_exact(prims, sched, {
            "chunks of 7": sched.chunked(7), "chunks of 64": sched.chunked(64),
            "lanes mixed 1/9/3": sched.mixed([1, 9, 3], lambda k: [0, 1, 2] if k % 2 else [2, 1, 0]),
        })
    with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=320, threads=threads, optimization=optimization, cache_inputs="slots") as prims:
        window = sched.run(prims, sched.chunked(5))
    for lane in sched.seqs:
        assert np.array_equal(bits(window[lane]), bits(plain[lane])), f"the whole window: lane {lane}"


WIDE_HEADS = {  # name: (config overrides, weights)
    "hd64": (dict(head_dim=64), "float32"),  # MLAS chunks a 64-column PV's keys by 256 when one thread computes it, 512 when two split it
    "hd64-int8": (dict(head_dim=64), "int8"),
    "hd64-q4": (dict(head_dim=64), "q4"),
    "hd256": (dict(head_dim=256, n_kv_heads=1), "float32"),  # Gemma 3's width: QK^T itself sums 256 terms
}


@pytest.fixture(scope="module", params=sorted(WIDE_HEADS))
def wide_head_model_dir(request, tmp_path_factory):
    """The tiny model with wide heads: wide enough that MLAS's way of summing an attention
    product depends on how threads split it (``sf_trt.graphs.ort_attention``)."""
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.pipeline import write_model_dir
    from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

    overrides, weights = WIDE_HEADS[request.param]
    cfg = tiny_llama_config(**overrides)
    graph = build_decoder_graph(cfg, random_llama_weights(cfg, seed=3), weight_dtype=weights)
    return write_model_dir(tmp_path_factory.mktemp(request.param) / "model", cfg, graph, weight_dtype=weights)


@pytest.mark.parametrize("threads", [1, 2, 4, 8])
def test_rows_are_exact_at_any_thread_count_past_the_first_key_chunk(wide_head_model_dir, schedules, threads):
    """Heads of 64 (float32, int8 and q4 weights) and 256 dims, keys past 256 (where MLAS's first key chunk ends): a lane
    decoded one row a pass, prefilled in chunks, or packed beside other lanes, gives every row
    the same bits at 1, 2, 4 and 8 threads (64: ONNX ``Attention``; 256: the matmuls summed in
    parts). Before onnxruntime's CPU backend ran the attention so, a 1-row pass at more threads than
    ``lanes * n_kv_heads`` summed its keys in other chunks than a prefill pass did, and a
    256-dim head's ``QK^T`` changed its chunks with the key extent."""
    rng = np.random.default_rng(21)
    sched = schedules({0: rng.integers(0, 256, 300), 1: rng.integers(0, 256, 40), 2: rng.integers(0, 256, 290)})
    with OrtDecoderPrimitives(wide_head_model_dir, max_lanes=3, max_context=320, threads=threads) as prims:
        assert_schedules_exact(prims, sched, {
            "chunks of 64": sched.chunked(64), "chunks of 290": sched.chunked(290),
            "lanes mixed 1/9/3": sched.mixed([1, 9, 3], lambda k: [0, 1, 2] if k % 2 else [2, 1, 0]),
        }, label=f"{threads} threads, ")


def test_tiny_rows_are_exact_in_the_slots_form(tiny_model_dir, schedules):
    rng = np.random.default_rng(12)
    sched = schedules({0: rng.integers(0, 256, 20), 1: rng.integers(0, 256, 15), 2: rng.integers(0, 256, 18)})
    with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=64, cache_inputs="slots") as prims:
        assert_rows_exact(prims, sched)


def test_tiny_rows_do_not_depend_on_how_runs_are_split(tiny_model_dir, schedules):
    """pass_cost_rows=0: every lane its own run; huge: all lanes in one padded run."""
    rng = np.random.default_rng(13)
    sched = schedules({0: rng.integers(0, 256, 25), 1: rng.integers(0, 256, 9), 2: rng.integers(0, 256, 17)})
    mixed = sched.mixed([9, 1, 4], lambda k: [0, 1, 2])
    out = []
    for cost in (0, 10**6):
        with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=64, pass_cost_rows=cost) as prims:
            out.append(sched.run(prims, mixed))
    for lane in sched.seqs:
        assert np.array_equal(bits(out[0][lane]), bits(out[1][lane]))


TEXTS = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "The Eiffel Tower is in Paris, and the Colosseum is in Rome.",
    "Über 3 Ängste — naïve café, 日本語 🙂 and more text",
]


@pytest.mark.slow
def test_real_model_rows_are_exact_in_any_pass(real_prims, schedules, real_tokenizer):
    """SmolLM2-135M (30 layers, 49152-token lm_head): the same schedules, bit for bit."""
    tok = real_tokenizer
    sched = schedules({lane: np.asarray(tok.encode(t)[:12], np.int64) for lane, t in enumerate(TEXTS)})
    assert all(len(s) == 12 for s in sched.seqs.values())
    assert_rows_exact(real_prims, sched)


@pytest.mark.slow
@pytest.mark.parametrize("export", ["real_int8_model_dir", "real_fp16_model_dir", "real_q4_model_dir", "real_int4_model_dir"])
def test_real_int8_and_fp16_models_rows_are_exact(export, schedules, real_tokenizer, request):
    with OrtDecoderPrimitives(request.getfixturevalue(export), max_lanes=3, max_context=128) as prims:
        tok = real_tokenizer
        sched = schedules({lane: np.asarray(tok.encode(t)[:8], np.int64) for lane, t in enumerate(TEXTS)})
        plain = sched.run(prims, sched.plain())
        for schedule in (sched.chunked(3), sched.mixed([1, 4, 7], lambda k: [2, 0, 1])):
            got = sched.run(prims, schedule)
            assert all(np.array_equal(bits(got[lane]), bits(plain[lane])) for lane in sched.seqs)


@pytest.mark.slow
def test_real_q4_rows_are_exact_whatever_the_key_extent(real_q4_model_dir, schedules, real_tokenizer):
    """SmolLM2 (head_dim 64, 30 layers) with q4 weights: a lane's rows with key extents from 64
    up to the whole window (the slots form) come out with the same bits."""
    tok = real_tokenizer
    text = " ".join(TEXTS) * 12
    ids = np.asarray(tok.encode(text), np.int64)
    sched = schedules({0: ids[:200], 1: ids[200:240]})
    with OrtDecoderPrimitives(real_q4_model_dir, max_lanes=2, max_context=384) as prims:
        plain = sched.run(prims, sched.chunked(1))
        mixed = sched.run(prims, sched.mixed([1, 16], lambda k: [1, 0]))
    with OrtDecoderPrimitives(real_q4_model_dir, max_lanes=2, max_context=384, cache_inputs="slots") as prims:
        window = sched.run(prims, sched.chunked(9))
    for lane in sched.seqs:
        assert np.array_equal(bits(mixed[lane]), bits(plain[lane])), f"mixed: lane {lane}"
        assert np.array_equal(bits(window[lane]), bits(plain[lane])), f"the whole window: lane {lane}"

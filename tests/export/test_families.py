"""Every family's declared differences (sf_trt.export.families) over the one decoder graph: the
graph against the float64 reference, rows bit-identical however a pass is packed and whatever
the thread count, speculative == plain (greedy and sampled)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from rows import assert_rows_exact, bits, close_to_reference

from sf_trt.abi import Sampling, SamplingFlag, SamplingParams
from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.export.decoder_graph import build_decoder_graph
from sf_trt.export.families import FAMILIES
from sf_trt.export.pipeline import write_model_dir
from sf_trt.export.reference import reference_forward
from sf_trt.export.tiny import random_llama_weights, tiny_family_config
from sf_trt.generate import Generator
from sf_trt.primitives import Rows
from sf_trt.scheduler import DraftPolicy, Request

VARIANTS = {
    **{arch: (arch, {}) for arch in FAMILIES},
    "llama3 (rope factors, biases)": ("llama", {"biases": True, "rope_factors": True}),
    "qwen2 (every bias)": ("qwen2", {"biases": True}),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def family_model(request, tmp_path_factory):
    """``(cfg, weights, model_dir)`` of a tiny random model of each family."""
    arch, extras = VARIANTS[request.param]
    cfg = tiny_family_config(arch)
    weights = random_llama_weights(cfg, seed=3, **extras)
    out = write_model_dir(tmp_path_factory.mktemp(arch) / "model", cfg, build_decoder_graph(cfg, weights))
    return cfg, weights, out


def _forward(prims, lane: int, tokens) -> np.ndarray:
    n = len(tokens)
    return prims.forward(Rows(np.full(n, lane, np.int64), np.arange(n, dtype=np.int64), np.asarray(tokens, np.int64), np.arange(n, dtype=np.int64)))


def test_every_family_declares_what_the_issue_names():
    assert set(FAMILIES) == {"llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3"}
    assert {"bq", "bk", "bv"} <= set(FAMILIES["qwen2"].required)
    assert {"q_norm", "k_norm"} <= set(FAMILIES["qwen3"].required)
    g = FAMILIES["gemma3"]
    assert (g.activation, g.embed_scale, g.hf_norm_offset, g.sliding) == ("gelu_tanh", True, 1.0, "pattern")
    assert g.sliding_layers(12, 512) == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10)
    assert FAMILIES["phi3"].fused == ("w_qkv", "w_gate_up")


def test_the_graph_computes_the_reference(family_model):
    """fp32 graph vs the float64 reference over 40 positions: past every tiny window (8, 16)."""
    cfg, weights, model_dir = family_model
    seq = np.random.default_rng(5).integers(0, cfg.vocab, 40)
    with OrtDecoderPrimitives(model_dir, max_lanes=2, max_context=64, threads=1) as prims:
        got = _forward(prims, 0, seq)
    ref = reference_forward(cfg, weights, seq)
    close_to_reference(got, ref)
    if cfg.sliding_layers:  # the window changes what the rows are: a reference without it does not match
        wide = reference_forward(dataclasses.replace(cfg, sliding_window=0, sliding_layers=()), weights, seq)
        assert np.abs(wide[-1] - ref[-1]).max() > 1e-3


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_are_exact_in_any_pass(family_model, schedules, threads):
    cfg, _, model_dir = family_model
    rng = np.random.default_rng(11)
    sched = schedules({0: rng.integers(0, cfg.vocab, 30), 1: rng.integers(0, cfg.vocab, 22), 2: rng.integers(0, cfg.vocab, 27)})
    with OrtDecoderPrimitives(model_dir, max_lanes=3, max_context=64, threads=threads) as prims:
        assert_rows_exact(prims, sched)


def test_rows_do_not_depend_on_the_thread_count(family_model, schedules):
    cfg, _, model_dir = family_model
    rng = np.random.default_rng(12)
    sched = schedules({0: rng.integers(0, cfg.vocab, 26), 1: rng.integers(0, cfg.vocab, 19)})
    out = []
    for threads in (1, 2):
        with OrtDecoderPrimitives(model_dir, max_lanes=2, max_context=64, threads=threads) as prims:
            out.append(sched.run(prims, sched.mixed([3, 5], lambda k: [1, 0])))
    for lane in sched.seqs:
        assert np.array_equal(bits(out[0][lane]), bits(out[1][lane])), f"lane {lane}"


SAMPLINGS = {
    "greedy": (Sampling.GPU_GREEDY, SamplingParams(max_tokens=40, flags=SamplingFlag.IGNORE_EOS)),
    "sampled": (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=40, flags=SamplingFlag.IGNORE_EOS)),
}


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_speculative_emits_exactly_the_plain_tokens(family_model, sampling):
    cfg, _, model_dir = family_model
    mode, params = SAMPLINGS[sampling]
    rng = np.random.default_rng(13)
    prompts = [list(rng.integers(3, cfg.vocab, 6)) * 4, list(rng.integers(3, cfg.vocab, 17)), [7, 8, 9, 7, 8, 9, 7, 8]]
    with OrtDecoderPrimitives(model_dir, max_lanes=3, max_context=128, threads=1) as prims:
        gen = Generator(prims, policy=DraftPolicy())
        plain = [gen.run([Request(p, mode, params, seed=5, speculate=False)])[0] for p in prompts]
        for kind in ("prompt-lookup", "suffix"):
            spec = gen.run([Request(p, mode, params, seed=5, drafter=kind) for p in prompts])
            for a, b in zip(plain, spec):
                assert (b.tokens, b.finish) == (a.tokens, a.finish), kind
            assert sum(s.proposed for s in spec) > 0, kind


@pytest.mark.parametrize("export", [{"weight_dtype": "int8"}, {"precision": "fp16"}, {"weight_dtype": "q4"}], ids=["int8", "fp16", "q4"])
@pytest.mark.parametrize("arch", sorted(FAMILIES))
def test_rows_are_exact_in_any_pass_at_every_weight_type(arch, export, schedules, tmp_path):
    """Each family's int8, fp16 and q4 graphs: rows bit-identical under every packing, and within 5% of
    the float64 reference of the weights they hold (int8 and q4 compute with int8 activations, fp16 in
    float16: the family's nodes are built in the compute type too)."""
    cfg = tiny_family_config(arch)
    weights = random_llama_weights(cfg, seed=4, biases=arch == "llama")
    graph = build_decoder_graph(cfg, weights, **export)
    model_dir = write_model_dir(tmp_path / "m", cfg, graph, weight_dtype=export.get("weight_dtype", "float32"))
    rng = np.random.default_rng(17)
    sched = schedules({0: rng.integers(0, cfg.vocab, 24), 1: rng.integers(0, cfg.vocab, 19), 2: rng.integers(0, cfg.vocab, 21)})
    with OrtDecoderPrimitives(model_dir, max_lanes=3, max_context=64, threads=1) as prims:
        assert_rows_exact(prims, sched)
        got = _forward(prims, 0, sched.seqs[0])
    from sf_trt.export.quantize import int8_weights, q4_weights

    computed = {"int8": int8_weights, "q4": q4_weights}.get(export.get("weight_dtype"), lambda w: w)(weights)  # the values the graph holds
    ref = reference_forward(cfg, computed, sched.seqs[0])
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max(), "far from the reference of the weights it holds"

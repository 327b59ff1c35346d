"""The decoder graph (sf_trt.export.decoder_graph): plain ONNX, both forms, against the float64 reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from rows import SEQ, bits, close_to_reference, concat, rows
from sf_trt.export.decoder_graph import build_decoder_graph
from sf_trt.export.gguf_llama import unpermute_rotary_rows
from sf_trt.export.reference import reference_forward
from sf_trt.export.tiny import random_llama_weights, tiny_llama_config

from sf_trt.backends.ort_decoder import OrtDecoderPrimitives


@pytest.fixture
def prims(tiny_model_dir):
    p = OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=64, threads=1)
    yield p
    p.close()


@pytest.mark.parametrize("cache_inputs, weight_dtype, n_kv_heads", [("pass", "float32", 2), ("slots", "float32", 2), ("slots", "int8", 2), ("slots", "float32", 4)])
def test_graph_is_plain_onnx_that_tensorrt_parses(cache_inputs, weight_dtype, n_kv_heads):
    from sf_trt.export.trt_support import check_graph, errors_in, format_findings

    cfg = tiny_llama_config(n_kv_heads=n_kv_heads)
    weights = random_llama_weights(cfg, 0)
    model = build_decoder_graph(cfg, weights, max_lanes=2, max_context=64, cache_inputs=cache_inputs, weight_dtype=weight_dtype)
    onnx.checker.check_model(model)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    ops = {n.op_type for n in model.graph.node}
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    assert not ops & {"TopK", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Sin", "Cos"}
    errors = errors_in(check_graph(model))
    assert not errors, format_findings(errors)


def test_registry_builds_the_decoder():
    from sf_trt.export.registry import GRAPHS

    model = GRAPHS["decoder"]()
    assert {i.name for i in model.graph.input} >= {"input_ids", "positions", "logit_index", "past_key_0", "past_value_1"}


def test_slots_form_equals_pass_form_bit_for_bit(tiny):
    from sf_trt.export.decoder_graph import pass_form

    cfg, weights = tiny
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    slots_graph = build_decoder_graph(cfg, weights)
    converted = pass_form(slots_graph)
    built = build_decoder_graph(cfg, weights, cache_inputs="pass")
    assert [n.op_type for n in converted.graph.node] == [n.op_type for n in built.graph.node]
    run = {
        form: ort.InferenceSession(g.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for form, g in (("pass", converted), ("slots", slots_graph))
    }
    rng = np.random.default_rng(3)
    slots = rng.standard_normal((cfg.n_layers * 2, 3, cfg.n_kv_heads, 33, cfg.head_dim)).astype(np.float32)
    lane_ids = np.array([2, 0])
    base = {"input_ids": rng.integers(0, cfg.vocab, (2, 4)), "positions": np.array([[5, 6, 7, 32], [20, 21, 22, 23]]), "logit_index": np.arange(8)}
    feeds = {"pass": dict(base), "slots": dict(base, lane_ids=lane_ids)}
    for i in range(cfg.n_layers):
        for j, kind in enumerate(("key", "value")):
            feeds["pass"][f"past_{kind}_{i}"] = np.ascontiguousarray(slots[2 * i + j][lane_ids])
            feeds["slots"][f"past_{kind}_{i}"] = slots[2 * i + j]
    out = {form: run[form].run(None, feeds[form]) for form in run}
    for a, b in zip(out["pass"], out["slots"]):
        assert np.array_equal(bits(a), bits(b))


def test_prefill_matches_the_float64_reference(tiny, prims):
    cfg, weights = tiny
    logits = prims.forward(rows(0, 0, SEQ))
    close_to_reference(logits, reference_forward(cfg, weights, SEQ))


def test_decode_row_by_row_matches_the_reference(tiny, prims):
    cfg, weights = tiny
    got = np.stack([prims.forward(rows(1, t, SEQ[t:t + 1]))[0] for t in range(20)])
    close_to_reference(got, reference_forward(cfg, weights, SEQ[:20]))


def test_int8_graph_computes_the_int8_weights(tiny, tiny_int8_model_dir):
    """onnxruntime runs DequantizeLinear -> MatMul as MatMulNBits with int8 compute
    (activations quantized per row and block): within about 1% of the int8 model."""
    from sf_trt.export.quantize import int8_weights

    cfg, weights = tiny
    with OrtDecoderPrimitives(tiny_int8_model_dir, max_lanes=1, max_context=64) as p:
        got = p.forward(rows(0, 0, SEQ[:24]))
        assert p.weight_dtype == "int8"
    want = reference_forward(cfg, int8_weights(weights), SEQ[:24])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
    assert np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.9


def test_reference_rotary_conventions_agree_after_unpermuting(tiny):
    """GGUF rows + interleaved rotation == HF rows + rotate_half (the two layouts of one model)."""
    cfg, weights = tiny
    hf_layers = [
        dataclasses.replace(layer, wq=unpermute_rotary_rows(layer.wq, cfg.n_heads), wk=unpermute_rotary_rows(layer.wk, cfg.n_kv_heads))
        for layer in weights.layers
    ]
    hf = dataclasses.replace(weights, layers=hf_layers)
    a = reference_forward(cfg, weights, SEQ[:16], rope="interleaved")
    b = reference_forward(cfg, hf, SEQ[:16], rope="half")
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)
    assert not np.allclose(a, reference_forward(cfg, weights, SEQ[:16], rope="half"), atol=1e-3)


def test_both_forms_run_from_the_model_dir_bit_for_bit(tiny_model_dir):
    out = {}
    for form in ("pass", "slots"):
        with OrtDecoderPrimitives(tiny_model_dir, max_lanes=3, max_context=64, cache_inputs=form) as p:
            a = p.forward(concat(rows(2, 0, SEQ[:9]), rows(0, 0, SEQ[9:12])))
            b = p.forward(concat(rows(0, 3, SEQ[12:14]), rows(2, 9, SEQ[14:15])))
            out[form] = np.concatenate([a, b])
    assert np.array_equal(bits(out["pass"]), bits(out["slots"]))

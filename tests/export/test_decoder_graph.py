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


@pytest.mark.parametrize("weight_dtype", ["int8", "q4"])
def test_quantized_graph_computes_its_quantized_weights(tiny, weight_dtype, request):
    """int8: onnxruntime runs DequantizeLinear -> MatMul as MatMulNBits with int8 compute
    (activations quantized per row and block); q4: MatMulNBits over Q4_1 blocks (plus their
    offsets) and a Q8_0 lm_head, int8 compute. Either is within about 1% of the model whose
    weights are the quantized values."""
    from sf_trt.export.quantize import int8_weights, q4_weights

    cfg, weights = tiny
    with OrtDecoderPrimitives(request.getfixturevalue(f"tiny_{weight_dtype}_model_dir"), max_lanes=1, max_context=64) as p:
        got = p.forward(rows(0, 0, SEQ[:24]))
        assert p.weight_dtype == weight_dtype
    want = reference_forward(cfg, {"int8": int8_weights, "q4": q4_weights}[weight_dtype](weights), SEQ[:24])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
    assert np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.9


def test_int4_graph_requantizes_every_matrix_and_the_lm_head(tiny_mixed_q4, tiny_mixed_int4_model_dir):
    """``weights="int4"``: the Q4_0, Q4_1 and Q4_K blocks a q4 export carries are requantized like every
    other matrix, so no matrix has offsets (no float32 ``MatMul`` of block sums, no Split, no Sum): one
    4-bit ``MatMulNBits`` per matrix with its zero points, the lm_head too (untied from the embedding's
    Q8_0 table, which the embedding still gathers); the model computes within about 1% of the values
    they hold."""
    from sf_trt.export.quantize import q4_weights, requantize_4bit

    cfg, weights = tiny_mixed_q4
    graph = onnx.load(str(tiny_mixed_int4_model_dir / "decoder.onnx"))
    inits = {t.name for t in graph.graph.initializer}
    nbits = [n for n in graph.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 4 * cfg.n_layers + 1 and {onnx.helper.get_attribute_value(a) for n in nbits for a in n.attribute if a.name == "bits"} == {4}
    assert not [i for i in inits if i.endswith(".offset")] and {"lm_head.zero", "tok_embd.q8"} <= inits
    assert not [n for n in graph.graph.node if n.op_type == "Sum" or n.name.endswith("_offsets")]
    held = q4_weights(weights, "int4")
    for i, layer in enumerate(weights.layers):  # carried blocks too: requantized from their values
        for f in ("wq", "w_gate", "w_down"):
            np.testing.assert_array_equal(getattr(held.layers[i], f), requantize_4bit(getattr(layer, f)).dequantize())
    np.testing.assert_array_equal(held.lm_head, requantize_4bit(weights.output_matrix()).dequantize())
    with OrtDecoderPrimitives(tiny_mixed_int4_model_dir, max_lanes=1, max_context=64) as p:
        got = p.forward(rows(0, 0, SEQ[:24]))
        assert p.weight_dtype == "int4"
    want = reference_forward(cfg, held, SEQ[:24])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
    assert np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.9


def test_q4_graph_of_mixed_blocks_computes_their_values(tiny_mixed_q4, tiny_mixed_q4_model_dir):
    """Q4_0, Q4_1 and Q4_K blocks carried and float matrices requantized, mixed in one fused matrix:
    one MatMulNBits per matrix, with zero points where a requantized part is in it and offsets where
    a Q4_1 or Q4_K part is; the model computes within about 1% of the weights they hold."""
    from sf_trt.export.quantize import q4_weights

    cfg, weights = tiny_mixed_q4
    graph = onnx.load(str(tiny_mixed_q4_model_dir / "decoder.onnx"))
    inits = {t.name for t in graph.graph.initializer}
    has = {m: (f"{m}.zero" in inits, f"{m}.offset" in inits) for m in ("l0.w_qkv", "l0.w_gate_up", "l1.w_qkv", "l1.w_o", "l1.w_gate_up")}
    assert has == {"l0.w_qkv": (True, True), "l0.w_gate_up": (False, True), "l1.w_qkv": (False, False), "l1.w_o": (True, False), "l1.w_gate_up": (False, True)}
    assert sum(n.op_type == "MatMulNBits" for n in graph.graph.node) == 4 * cfg.n_layers + 1  # qkv, o, gate_up, down; the 8-bit lm_head
    held = q4_weights(weights)
    for i, kinds in {0: ("wq", "w_gate", "w_down"), 1: ("wq", "w_down")}.items():  # carried parts: their own values
        for f in kinds:
            want = getattr(weights.layers[i], f)
            np.testing.assert_allclose(getattr(held.layers[i], f), want, rtol=0, atol=1e-6 * float(np.abs(want).max()))
    with OrtDecoderPrimitives(tiny_mixed_q4_model_dir, max_lanes=1, max_context=64) as p:
        got = p.forward(rows(0, 0, SEQ[:24]))
    want = reference_forward(cfg, held, SEQ[:24])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
    assert np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.9


def test_gguf_graph_of_mixed_blocks_computes_their_own_values(tiny_mixed_gguf, tiny_mixed_gguf_model_dir):
    """``weights="gguf"``: every GGUF block type in its own values (Q5_*, Q6_K, Q8_0 in 8 bits, Q6_K's
    blocks of 16), the float matrix in Q8_0; the model computes within about 1% of them."""
    from sf_trt.export.quantize import q4_weights

    cfg, weights = tiny_mixed_gguf
    held = q4_weights(weights, "gguf")
    for i, kinds in {0: ("wq", "wv", "wo", "w_gate", "w_up", "w_down"), 1: ("wq", "w_gate", "w_down")}.items():
        for f in kinds:
            want = getattr(weights.layers[i], f)
            np.testing.assert_allclose(getattr(held.layers[i], f), want, rtol=0, atol=1e-6 * float(np.abs(want).max()))
    blocks = {n.input[1]: {a.name: a.i for a in n.attribute}["block_size"]
              for n in onnx.load(str(tiny_mixed_gguf_model_dir / "decoder.onnx")).graph.node if n.op_type == "MatMulNBits"}
    assert blocks["l0.w_qkv.q8"] == 16 and blocks["l0.w_down.q8"] == 16 and blocks["l1.w_qkv.q4"] == 32
    with OrtDecoderPrimitives(tiny_mixed_gguf_model_dir, max_lanes=1, max_context=64) as p:
        got = p.forward(rows(0, 0, SEQ[:24]))
    want = reference_forward(cfg, held, SEQ[:24])
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
    assert np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.9


def test_q4_graph_holds_the_given_blocks_byte_for_byte(tiny):
    """Blocks a GGUF stores (LlamaWeights.blocks) go into the graph as they are: the
    4-bit values and scales of MatMulNBits, the offsets, the Q8_0 embedding table."""
    from onnx import numpy_helper

    from sf_trt.export.quantize import GgmlBlocks

    cfg, weights = tiny
    given = GgmlBlocks.quantize(np.concatenate([weights.layers[1].wq, weights.layers[1].wk, weights.layers[1].wv]), "Q4_1")
    n_q, n_kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    parts = {"wq": given.raw[:n_q], "wk": given.raw[n_q:n_q + n_kv], "wv": given.raw[n_q + n_kv:]}
    embd = GgmlBlocks.quantize(weights.tok_embd, "Q8_0")
    with_blocks = dataclasses.replace(weights, blocks={**{f"layers.1.{k}": ("Q4_1", v) for k, v in parts.items()}, "tok_embd": ("Q8_0", embd.raw)})
    inits = {t.name: numpy_helper.to_array(t) for t in build_decoder_graph(cfg, with_blocks, weight_dtype="q4").graph.initializer}
    carried = given.nbits()
    b, scales, offsets = carried.packed(), carried.scales.reshape(-1), carried.offsets
    n = b.shape[0]  # then K / 32 rows of block indicators (the block sums), scale 1
    assert np.array_equal(inits["l1.w_qkv.q4"][:n], b) and np.array_equal(inits["l1.w_qkv.scale"][:scales.size], scales)
    assert np.all(inits["l1.w_qkv.scale"][scales.size:] == 1.0)
    assert np.array_equal(inits["l1.w_qkv.offset"], offsets.T)
    assert "l1.w_qkv.zero" not in inits  # every block at the default zero point 8
    assert np.array_equal(inits["tok_embd.q8"], embd.nbits().packed())
    # and what they compute is the GGUF's dequantization, gguf's own code
    import gguf

    want = gguf.quants.dequantize(given.raw, gguf.GGMLQuantizationType.Q4_1).reshape(given.shape)
    assert np.array_equal(given.dequantize(), want)
    d, zero = scales.reshape(given.shape[0], -1, 1), 8.0
    q = np.stack([b & 15, b >> 4], axis=-1).reshape(given.shape[0], -1, 32).astype(np.float64)
    rebuilt = (d * (q - zero) + offsets[..., None]).reshape(given.shape)
    np.testing.assert_allclose(rebuilt, want, rtol=0, atol=1e-6 * float(np.abs(want).max()))


def test_q4_needs_fp32_compute(tiny):
    cfg, weights = tiny
    with pytest.raises(ValueError, match="q4 weights compute in onnxruntime's MatMulNBits"):
        build_decoder_graph(cfg, weights, weight_dtype="q4", precision="fp16")


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


def _types(model) -> dict[str, int]:
    """Every tensor's ONNX element type (inputs, initializers, inferred values, outputs)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {t.name: t.data_type for t in model.graph.initializer}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        types[vi.name] = vi.type.tensor_type.elem_type
    return types


@pytest.mark.parametrize("precision, weight_dtype", [("fp16", "float32"), ("bf16", "float32"), ("fp16", "int8")])
def test_a_reduced_precision_decoder_keeps_norms_softmax_and_the_residual_in_fp32(tiny, precision, weight_dtype):
    from onnx import TensorProto as T

    from sf_trt.export.decoder_graph import COMPUTE_TYPES
    from sf_trt.export.trt_support import check_graph, errors_in, format_findings
    from sf_trt.formats.model_dir import graph_precision

    cfg, weights = tiny
    model = build_decoder_graph(cfg, weights, max_lanes=2, max_context=64, precision=precision, weight_dtype=weight_dtype)
    onnx.checker.check_model(model)
    assert graph_precision(model) == precision
    errors = errors_in(check_graph(model))
    assert not errors, format_findings(errors)
    ct, types = COMPUTE_TYPES[precision], _types(model)
    nodes = list(model.graph.node)
    by_op = lambda op: [n for n in nodes if n.op_type == op]  # noqa: E731
    # every matmul (weights, attention, lm_head) in the compute type, on both operands
    assert {types[i] for n in by_op("MatMul") + by_op("Gemm") for i in n.input} == {ct}
    # the norms' statistics, the softmax and the residual stream in float32
    assert {types[n.input[0]] for n in by_op("ReduceMean") + by_op("Softmax")} == {T.FLOAT}
    residual = [n for n in by_op("Add") if "_resid" in n.output[0]]
    assert len(residual) == 2 * cfg.n_layers and {types[i] for n in residual for i in n.input} == {T.FLOAT}
    # the KV cache, new_kv and the rotary tables in the compute type; the logits float32
    io = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
    assert io["past_key_0"] == io["past_value_1"] == io["new_kv"] == ct and io["logits"] == T.FLOAT
    assert types["rope_cos"] == types["tok_embd"] == ct and types["l0.attn_norm"] == T.FLOAT


def test_an_fp32_decoder_has_no_cast(tiny):
    cfg, weights = tiny
    model = build_decoder_graph(cfg, weights)
    assert "Cast" not in {n.op_type for n in model.graph.node}
    from sf_trt.formats.model_dir import graph_precision

    assert graph_precision(model) == "fp32"


def test_a_decoder_of_fixed_lanes_and_context_loads_on_onnxruntime(tiny):
    """A static cache length once made onnxruntime refuse the graph ("Input to 'Range' op should be scalars")."""
    cfg, weights = tiny
    model = build_decoder_graph(cfg, weights, max_lanes=2, max_context=32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    caches = {i.name: np.zeros((2, cfg.n_kv_heads, 33, cfg.head_dim), np.float32) for i in model.graph.input if i.name.startswith("past_")}
    feeds = {"input_ids": SEQ[None, :4], "positions": np.arange(4)[None], "lane_ids": np.array([1]), "logit_index": np.arange(4), **caches}
    logits, _ = sess.run(None, feeds)
    close_to_reference(logits, reference_forward(cfg, weights, SEQ[:4]))


def test_the_fp16_decoder_on_onnxruntime_is_close_to_the_reference(tiny, tiny_fp16_model_dir):
    """Weights rounded to float16 and matmuls in float16: within 0.1% of the largest logit of the float64 model."""
    cfg, weights = tiny
    with OrtDecoderPrimitives(tiny_fp16_model_dir, max_lanes=1, max_context=64) as p:
        assert p.precision == "fp16"
        got = p.forward(rows(0, 0, SEQ[:32]))
    want = reference_forward(cfg, weights, SEQ[:32])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * float(np.abs(want).max()))
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))


def test_a_bf16_decoder_is_refused_by_onnxruntime_in_one_line(tiny, tmp_path):
    from sf_trt.export.pipeline import write_model_dir

    from sf_trt.abi import Status, StatusError

    cfg, weights = tiny
    out = write_model_dir(tmp_path / "m", cfg, build_decoder_graph(cfg, weights, precision="bf16"))
    with pytest.raises(StatusError, match=r"holds a bf16 decoder, which onnxruntime's CPU kernels do not run .*--precision fp32 or fp16") as err:
        OrtDecoderPrimitives(out, max_lanes=1, max_context=16)
    assert err.value.status == Status.UNSUPPORTED and "\n" not in str(err.value)

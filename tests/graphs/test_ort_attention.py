"""The decoder's attention as onnxruntime's CPU backend runs it (sf_trt.graphs.ort_attention)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from rows import bits

from sf_trt.export.decoder_graph import build_decoder_graph, pass_form
from sf_trt.export.tiny import random_llama_weights, tiny_llama_config
from sf_trt.graphs.ort_attention import ATTENTION_OPSET, exact_attention, pv_columns


@pytest.mark.parametrize("overrides, precision, fused", [
    ({}, "fp32", True), ({"n_kv_heads": 4}, "fp32", True), ({"head_dim": 256, "n_kv_heads": 1}, "fp32", False), ({}, "fp16", False),
], ids=["gqa", "mha", "head-256", "fp16"])
def test_float32_heads_up_to_128_dims_become_onnx_attention_the_rest_matmuls_in_parts(overrides, precision, fused):
    cfg = tiny_llama_config(**overrides)
    slots = build_decoder_graph(cfg, random_llama_weights(cfg, 0), precision=precision)
    for form in (slots, pass_form(slots)):
        model = exact_attention(form)
        onnx.checker.check_model(model)
        assert [(o.domain, o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")] == [("", ATTENTION_OPSET)]
        ops = [n.op_type for n in model.graph.node]
        assert ops.count("Attention") == (cfg.n_layers if fused else 0)
        assert ops.count("Softmax") == (0 if fused else cfg.n_layers)
        qk_parts = -(-cfg.head_dim // 128)
        assert ops.count("MatMul") - [n.op_type for n in form.graph.node].count("MatMul") == (
            -2 * cfg.n_layers if fused else (qk_parts - 1) * cfg.n_layers)
        assert not any(a.name == "axes" for n in model.graph.node if n.op_type == "ReduceMean" for a in n.attribute)
        assert [(o.domain, o.version) for o in form.opset_import] == [("", 17)]  # the written graph is left as it was


def test_the_rewritten_graph_gives_the_rows_of_the_written_one_where_no_gemm_is_split():
    """At one thread no GEMM is split, so ``Attention``'s per-head GEMMs are the batched matmuls'
    own: the same bits as the graph as written."""
    cfg = tiny_llama_config(head_dim=64)
    written = pass_form(build_decoder_graph(cfg, random_llama_weights(cfg, 1)))
    rng = np.random.default_rng(2)
    feeds = {"input_ids": rng.integers(0, cfg.vocab, (2, 5)), "positions": np.array([[3, 4, 5, 6, 7], [40, 41, 42, 43, 44]]), "logit_index": np.arange(10)}
    for i in range(cfg.n_layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = rng.standard_normal((2, cfg.n_kv_heads, 64, cfg.head_dim)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    out = [ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(["logits"], feeds)[0]
           for m in (written, exact_attention(written))]
    assert np.array_equal(bits(out[0]), bits(out[1]))


def test_pv_columns_is_the_widest_divisor_up_to_16():
    assert [pv_columns(d) for d in (16, 64, 80, 96, 128, 256, 72, 12)] == [16, 16, 16, 16, 16, 16, 12, 12]

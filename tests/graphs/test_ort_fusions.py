"""onnxruntime's fused ops in the decoder graph it runs (sf_trt.graphs.ort_fusions): each proven row-exact."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from rows import bits

from sf_trt.export.decoder_graph import build_decoder_graph, pass_form
from sf_trt.export.tiny import random_llama_weights, tiny_family_config, tiny_llama_config
from sf_trt.formats.model_dir import ModelDir
from sf_trt.graphs.ort_fusions import FUSED_OPS, MS_DOMAIN, onnxruntime_fused

FUSIONS = {"rotary": dict(skip_norm=False), "skip_norm": dict(rotary=False), "both": {}}
EXTENT = 64


@pytest.fixture(scope="module")
def tiny_graphs():
    cfg = tiny_llama_config()
    weights = random_llama_weights(cfg, 0)
    return cfg, {dtype: pass_form(build_decoder_graph(cfg, weights, weight_dtype=dtype)) for dtype in ("float32", "int8")}


def _session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "4")  # the int8 runtime's setting
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _run(sess, cfg, caches: np.ndarray, lanes: list[int], tokens: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One pass of ``lanes`` (their caches from ``caches``), each with its rows' tokens and positions ``[B, T]``:
    every row's logits ``[B, T, vocab]`` and new K/V ``[layers, 2, B, T, nkv, hd]``."""
    b, t = tokens.shape
    feeds = {"input_ids": tokens, "positions": positions, "logit_index": np.arange(b * t)}
    for i in range(cfg.n_layers):
        for j, kind in enumerate(("key", "value")):
            feeds[f"past_{kind}_{i}"] = np.ascontiguousarray(caches[2 * i + j][lanes])
    logits, new_kv = sess.run(["logits", "new_kv"], feeds)
    return logits.reshape(b, t, -1), new_kv


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("fusion", list(FUSIONS))
def test_a_row_has_the_same_bits_in_a_one_row_a_nine_row_and_an_eight_lane_pass(tiny_graphs, fusion, dtype, threads):
    """Lane 0's row at position 20: alone, first of a 9-row verify pass, and beside 7 other lanes."""
    cfg, graphs = tiny_graphs
    fused = onnxruntime_fused(graphs[dtype], **FUSIONS[fusion])
    assert {n.op_type for n in fused.graph.node if n.domain == MS_DOMAIN} == (
        set(FUSED_OPS) if fusion == "both" else {"RotaryEmbedding" if fusion == "rotary" else "SkipSimplifiedLayerNormalization"})
    sess = _session(fused, threads)
    rng = np.random.default_rng(5)
    caches = rng.standard_normal((2 * cfg.n_layers, 8, cfg.n_kv_heads, EXTENT, cfg.head_dim)).astype(np.float32)
    token, pos = 17, 20
    one = _run(sess, cfg, caches, [0], np.array([[token]]), np.array([[pos]]))
    verify = _run(sess, cfg, caches, [0], np.r_[token, rng.integers(0, cfg.vocab, 8)][None], np.arange(pos, pos + 9)[None])
    lanes = _run(sess, cfg, caches, list(range(8)), np.r_[token, rng.integers(0, cfg.vocab, 7)][:, None],
                 np.r_[pos, rng.integers(0, EXTENT - 1, 7)][:, None])
    for name, (logits, new_kv) in {"9 rows": verify, "8 lanes": lanes}.items():
        assert np.array_equal(bits(logits[0, 0]), bits(one[0][0, 0])), f"{fusion}, {dtype}, {threads} threads: logits in {name}"
        assert np.array_equal(bits(new_kv[:, :, 0, 0]), bits(one[1][:, :, 0, 0])), f"{fusion}, {dtype}, {threads} threads: K/V in {name}"


@pytest.mark.parametrize("fusion", list(FUSIONS))
def test_the_fused_graph_computes_the_same_model(tiny_graphs, fusion):
    """The same logits and K/V as the builder's graph, up to the last bits' rounding."""
    cfg, graphs = tiny_graphs
    plain, fused = _session(graphs["float32"], 1), _session(onnxruntime_fused(graphs["float32"], **FUSIONS[fusion]), 1)
    rng = np.random.default_rng(8)
    caches = rng.standard_normal((2 * cfg.n_layers, 2, cfg.n_kv_heads, EXTENT, cfg.head_dim)).astype(np.float32)
    tokens, positions = rng.integers(0, cfg.vocab, (2, 4)), np.array([[5, 6, 7, 8], [40, 41, 42, 63]])
    for a, b in zip(_run(plain, cfg, caches, [0, 1], tokens, positions), _run(fused, cfg, caches, [0, 1], tokens, positions)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_each_layer_is_fused_and_the_rest_left_as_written(tiny_graphs):
    """Two RotaryEmbedding a layer; a SkipSimplifiedLayerNormalization for every norm after a residual add
    (all but layer 0's first, after the embedding, and the final one, over the gathered rows)."""
    cfg, graphs = tiny_graphs
    plain, fused = graphs["float32"], onnxruntime_fused(graphs["float32"])
    contrib = [n.op_type for n in fused.graph.node if n.domain == MS_DOMAIN]
    assert contrib.count("RotaryEmbedding") == 2 * cfg.n_layers
    assert contrib.count("SkipSimplifiedLayerNormalization") == 2 * cfg.n_layers - 1
    assert (MS_DOMAIN, 1) in [(o.domain, o.version) for o in fused.opset_import]
    assert "pair_swap" not in {t.name for t in fused.graph.initializer}  # the rotation's swapped copy is gone
    assert len(fused.graph.node) < len(plain.graph.node)
    assert all(n.domain in ("", "ai.onnx") for n in plain.graph.node)  # the input is not changed


def test_a_rotation_after_per_head_norms_is_left_as_written():
    """Qwen 3 norms each q and k head before rotating it: no RotaryEmbedding, the norms after residual adds still fused."""
    cfg = tiny_family_config("qwen3")
    fused = onnxruntime_fused(pass_form(build_decoder_graph(cfg, random_llama_weights(cfg, 0))))
    ops = [n.op_type for n in fused.graph.node]
    assert "RotaryEmbedding" not in ops and ops.count("SkipSimplifiedLayerNormalization") == 2 * cfg.n_layers - 1


def test_the_cpu_backend_loads_either_form_fused_and_other_providers_as_written(tiny_model_dir):
    """The model directory's graphs are standard ONNX; onnxruntime's CPU backend loads them in its fused
    ops (the weights read from the directory's file), a GPU provider as written."""
    from sf_trt.backends.ort_decoder import loaded_graph

    model = ModelDir.open(tiny_model_dir)
    for form in ("pass", "slots"):
        path = model.graph_file(form)
        assert {n.domain for n in onnx.load(str(path), load_external_data=False).graph.node} <= {"", "ai.onnx"}
        config: dict[str, str] = {}
        fused = loaded_graph(path, ["CPUExecutionProvider"], config)
        assert {n.op_type for n in fused.graph.node if n.domain == MS_DOMAIN} == set(FUSED_OPS)
        assert config == {"session.model_external_initializers_file_folder_path": str(tiny_model_dir)}
        config = {}
        assert loaded_graph(path, [("CUDAExecutionProvider", {})], config) == path and config == {}

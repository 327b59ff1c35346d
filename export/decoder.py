"""The Llama decoder as one ONNX graph whose rows come out the same in any pass.

Exactness is the product: speculative decoding emits bit-identical tokens to
plain decoding only if **row r of a pass is bit-identical whatever the number of
rows in the pass and whichever other lanes share it**. So every reduction a row
goes through has a length and a layout that do not depend on the pass:

* matmuls reduce over the model's fixed dims (hidden, ffn, head_dim);
* attention reduces over the whole cache length ``S = max_context + 1``, every
  key at the index equal to its absolute position: the pass's new K/V are
  scattered (ScatterND) into the lane's cache before the scores are taken, and
  keys past the row's own position get ``-inf`` added (their softmax weight
  is exactly 0, so stale entries past a rolled-back length and the trash slot
  never reach a real row);
* rotary tables are gathered by position (no Sin/Cos kernels, whose vector tails
  could depend on the tensor size), once per pass for q and k heads together,
  the attention scale folded into q's rows;
* no matmul with a non-constant right operand ever runs with M == 1: MLAS takes
  a different path there (weight matmuls, whose operand is a prepacked constant,
  are the same at M == 1 and M > 1). The attention matmuls have M = group * T
  query rows per KV head; without GQA the queries are doubled.

Inputs (``B`` lanes in the pass, ``T`` rows per lane, ``K`` logit rows, ``L``
cache slots, ``S = max_context + 1``)::

    input_ids    int64 [B, T]
    positions    int64 [B, T]      absolute position of each row; padding rows use
                                   S - 1 (= max_context, the trash slot)
    lane_ids     int64 [B]         cache slot of each lane of the pass
    logit_index  int64 [K]         flat rows b * T + t whose logits are wanted
    past_key_i   float32 [L, n_kv_heads, S, head_dim]   (one pair per layer i;
    past_value_i float32 [L, n_kv_heads, S, head_dim]    read only)

That is the ``"slots"`` form (the default, and what TensorRT engines are built
from: the caches stay bound whole, the graph gathers the pass's lanes). The
``"pass"`` form (:func:`pass_form`) drops ``lane_ids`` and takes the pass's
lanes' caches directly, ``past_key_i [B, n_kv_heads, S, head_dim]``, lane b's at
b. onnxruntime's CPU ScatterND always copies its input (its kernel is not
declared in-place), so on the CPU the gathered form costs two copies of every
lane's cache per layer and the pass form one; the onnxruntime backend runs the
pass form over zero-copy views of the host cache. A model directory holds both
(``decoder.onnx``, ``decoder_pass.onnx``), sharing one weight file.

Outputs::

    logits  float32 [K, vocab]     hidden rows gathered by logit_index *before* the
                                   final norm and the lm_head, so prefill rows cost
                                   no lm_head
    new_kv  float32 [n_layers, 2, B, T, n_kv_heads, head_dim]  this pass's K (0)
                                   and V (1), post-rotary; the host writes row
                                   (b, t) into its cache at (lane_ids[b], :,
                                   positions[b, t], :), skipping padding rows

A real row at position ``p < max_context`` sees keys ``j <= p``; a padding row
(position ``max_context``) sees everything, and its output is thrown away.
``B``, ``L`` and ``S`` are symbolic unless given, so one exported graph
serves any ``max_lanes`` / ``max_context`` up to the model's context length.

Rotary convention: the GGUF q/k rows are in llama.cpp's interleaved order (see
:mod:`export.gguf_llama`), so each adjacent pair ``(2i, 2i+1)`` is rotated:
``out = x * cos + swap_pairs(x) * sin_signed``.

Ops (default domain, opset 17): Gather, MatMul, Gemm, Split, Reshape, Transpose,
Mul, Add, Div, Pow, Sqrt, ReduceMean, Sigmoid, Softmax, Where, LessOrEqual,
ScatterND, Shape, Range, Squeeze, Unsqueeze, Expand, Concat, Tile (and Slice
without GQA; DequantizeLinear with int8 weights). No TopK, no bitwise ops, no contrib ops.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sf_trt.graph_ranges import declare_ranges

from .gguf_llama import LlamaConfig, LlamaLayerWeights, LlamaWeights

__all__ = [
    "OPSET",
    "FORMAT_VERSION",
    "INPUTS",
    "OUTPUTS",
    "tiny_llama_config",
    "random_llama_weights",
    "rope_tables",
    "build_decoder_graph",
    "pass_form",
    "quantize_int8",
    "int8_weights",
    "WEIGHT_DTYPES",
    "reference_forward",
    "export_model_dir",
    "write_model_dir",
    "read_model_dir",
    "file_digest",
]

OPSET = 17
FORMAT_VERSION = 4  # bump whenever the graph or the directory layout changes: old exports are rebuilt
INPUTS = ("input_ids", "positions", "lane_ids", "logit_index")
"""The per-pass inputs of the default (slots) form; the pass form has no lane_ids."""
CACHE_INPUTS = ("pass", "slots")
OUTPUTS = ("logits", "new_kv")
GRAPH_FILE = "decoder.onnx"
PASS_GRAPH_FILE = "decoder_pass.onnx"
DATA_FILE = "decoder.onnx.data"
CONFIG_FILE = "config.json"


# -- configs and weights for tests ----------------------------------------------


def tiny_llama_config(**overrides: Any) -> LlamaConfig:
    """A small Llama (2 layers, GQA 4:2, head_dim 16, vocab 256) for fast tests."""
    base = dict(
        n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn=128, vocab=256,
        rope_theta=10000.0, rms_eps=1e-5, context_length=512, tied_embeddings=True, bos=1, eos=2,
    )
    base.update(overrides)
    return LlamaConfig(**base)


def random_llama_weights(cfg: LlamaConfig, seed: int = 0) -> LlamaWeights:
    """Random float32 weights of ``cfg``'s shapes, scaled so activations stay O(1)."""
    rng = np.random.default_rng(seed)

    def mat(out: int, inp: int) -> np.ndarray:
        return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(cfg.hidden)).astype(np.float32)

    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    layers = [
        LlamaLayerWeights(
            attn_norm=norm(), wq=mat(q, cfg.hidden), wk=mat(kv, cfg.hidden), wv=mat(kv, cfg.hidden),
            wo=mat(cfg.hidden, q), ffn_norm=norm(), w_gate=mat(cfg.ffn, cfg.hidden),
            w_up=mat(cfg.ffn, cfg.hidden), w_down=mat(cfg.hidden, cfg.ffn),
        )
        for _ in range(cfg.n_layers)
    ]
    embd = rng.standard_normal((cfg.vocab, cfg.hidden)).astype(np.float32)
    lm_head = None if cfg.tied_embeddings else mat(cfg.vocab, cfg.hidden)
    return LlamaWeights(tok_embd=embd, layers=layers, output_norm=norm(), lm_head=lm_head)


def rope_tables(cfg: LlamaConfig, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin_signed)`` float64 ``[length, head_dim]`` for interleaved pairs.

    ``cos[p, 2i] = cos[p, 2i+1] = cos(p * w_i)``, ``sin_signed[p, 2i] = -sin(p * w_i)``,
    ``sin_signed[p, 2i+1] = +sin(p * w_i)``, ``w_i = theta ** (-2i / head_dim)``.
    """
    half = cfg.head_dim // 2
    inv_freq = cfg.rope_theta ** (-np.arange(half, dtype=np.float64) * 2.0 / cfg.head_dim)
    angles = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.repeat(np.cos(angles), 2, axis=1)
    sin = np.sin(angles)
    sin_signed = np.stack([-sin, sin], axis=-1).reshape(length, cfg.head_dim)
    return cos, sin_signed


def _pair_swap(head_dim: int) -> np.ndarray:
    idx = np.arange(head_dim, dtype=np.int64)
    return idx ^ 1  # 1, 0, 3, 2, ...


WEIGHT_DTYPES = ("float32", "int8")


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output row of an ``[out, in]`` matrix: ``(q int8, scale float32 [out])``
    with ``w ~= q * scale[:, None]``."""
    w = np.asarray(w, dtype=np.float32)
    scale = (np.abs(w).max(axis=1) / 127.0).astype(np.float32)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def int8_weights(weights: LlamaWeights) -> LlamaWeights:
    """The float32 weights the ``weight_dtype="int8"`` graph computes with: every
    matrix replaced by its int8 dequantization (``q * scale``, as DequantizeLinear
    computes it); the embedding kept, the lm_head (then untied) quantized."""
    def deq(w: np.ndarray) -> np.ndarray:
        q, scale = quantize_int8(w)
        return q.astype(np.float32) * scale[:, None]

    mats = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
    layers = [dataclasses.replace(layer, **{m: deq(getattr(layer, m)) for m in mats}) for layer in weights.layers]
    return dataclasses.replace(weights, layers=layers, lm_head=deq(weights.output_matrix()))


# -- the graph ---------------------------------------------------------------------


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def i64(self, name: str, value) -> str:
        return self.init(name, np.asarray(value, dtype=np.int64))

    def op(self, op: str, inputs: list[str], stem: str, n_out: int = 1, **attrs):
        self._n += 1
        outs = [f"{stem}_{self._n}" if n_out == 1 else f"{stem}_{self._n}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=f"{op}_{stem}_{self._n}", **attrs))
        return outs[0] if n_out == 1 else outs


def _rms_norm(g: _Builder, x: str, weight: str, eps: str, two: str, stem: str) -> str:
    # Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul: the pattern onnxruntime fuses.
    ms = g.op("ReduceMean", [g.op("Pow", [x, two], f"{stem}_sq")], f"{stem}_ms", axes=[-1], keepdims=1)
    rms = g.op("Sqrt", [g.op("Add", [ms, eps], f"{stem}_mseps")], f"{stem}_rms")
    return g.op("Mul", [g.op("Div", [x, rms], f"{stem}_normed"), weight], stem)


def _rope(g: _Builder, x: str, cos: str, sin: str, swap: str, stem: str) -> str:
    """x [B, T, heads, hd] rotated pairwise by position (cos/sin [B, T, 1, hd])."""
    swapped = g.op("Gather", [x, swap], f"{stem}_swap", axis=3)
    return g.op("Add", [g.op("Mul", [x, cos], f"{stem}_c"), g.op("Mul", [swapped, sin], f"{stem}_s")], stem)


def build_decoder_graph(
    cfg: LlamaConfig,
    weights: LlamaWeights,
    max_lanes: int | None = None,
    max_context: int | None = None,
    *,
    cache_inputs: str = "slots",
    weight_dtype: str = "float32",
) -> onnx.ModelProto:
    """The decoder graph (see the module docstring for inputs and outputs).

    ``max_context`` fixes ``S - 1`` (None: symbolic; the rotary table then covers
    the model's ``context_length``); ``max_lanes`` fixes the slot dim of the
    ``"slots"`` form (and is only checked in the ``"pass"`` form).

    ``weight_dtype="int8"`` stores every matmul weight (and the lm_head) as int8
    with one float32 scale per output channel, as ``DequantizeLinear(axis=1) ->
    MatMul`` (standard ONNX; onnxruntime fuses the pair into its 8-bit
    weight-only kernel at load, a quarter of the bytes read per pass). The token
    embedding stays float32 (only the pass's rows are read). The model it
    computes is :func:`int8_weights` of ``weights``.
    """
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"build_decoder_graph: weight_dtype {weight_dtype!r} unknown (known: {', '.join(WEIGHT_DTYPES)})")
    if cache_inputs not in CACHE_INPUTS:
        raise ValueError(f"build_decoder_graph: cache_inputs {cache_inputs!r} unknown (known: {', '.join(CACHE_INPUTS)})")
    weights.check(cfg)
    if max_context is not None and not 1 <= max_context <= cfg.context_length:
        raise ValueError(f"build_decoder_graph: max_context {max_context} outside 1..{cfg.context_length} (the model's context length)")
    if max_lanes is not None and max_lanes < 1:
        raise ValueError(f"build_decoder_graph: max_lanes must be >= 1 (got {max_lanes})")
    nh, nkv, hd, grp = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.group
    table_len = (cfg.context_length if max_context is None else max_context) + 1
    g = _Builder()
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # noqa: E731

    def matrix(name: str, w: np.ndarray) -> str:
        """The ``[in, out]`` operand of ``x @ w.T`` for an ``[out, in]`` weight."""
        if weight_dtype == "float32":
            return g.init(name, np.ascontiguousarray(w.T))
        q, scale = quantize_int8(w)
        g.init(f"{name}.q", np.ascontiguousarray(q.T))
        g.init(f"{name}.scale", scale)
        return g.op("DequantizeLinear", [f"{name}.q", f"{name}.scale"], f"{name}_dq", axis=1)

    # constants
    cos_tab, sin_tab = rope_tables(cfg, table_len)
    g.init("rope_cos", f32(cos_tab))
    g.init("rope_sin", f32(sin_tab))
    g.init("tok_embd", weights.tok_embd)
    eps, two = g.init("rms_eps", f32(cfg.rms_eps)), g.init("two", f32(2.0))
    neg_inf = g.init("neg_inf", f32(-np.inf))
    swap = g.i64("pair_swap", _pair_swap(hd))
    split_gu = g.i64("split_gu", [cfg.ffn, cfg.ffn])
    zero, one = g.i64("zero", 0), g.i64("one", 1)
    ax0, ax2 = g.i64("axis0", [0]), g.i64("axis2", [2])

    # shared per pass: embeddings, rotary rows, mask, scatter indices
    x = g.op("Gather", ["tok_embd", "input_ids"], "embed", axis=0)  # [B, T, H]
    # rotary rows for q and k heads at once, the attention scale folded into q's
    head_scale = g.init("head_scale", f32(np.r_[np.full(nh, 1.0 / np.sqrt(hd)), np.ones(nkv)].reshape(nh + nkv, 1)))
    cos = g.op("Mul", [g.op("Unsqueeze", [g.op("Gather", ["rope_cos", "positions"], "cos_rows", axis=0), ax2], "cos_1"), head_scale], "cos")
    sin = g.op("Mul", [g.op("Unsqueeze", [g.op("Gather", ["rope_sin", "positions"], "sin_rows", axis=0), ax2], "sin_1"), head_scale], "sin")
    ids_shape = g.op("Shape", ["input_ids"], "ids_shape")
    b_dim = g.op("Shape", ["input_ids"], "b_dim", start=0, end=1)  # [1]
    t_dim = g.op("Shape", ["input_ids"], "t_dim", start=1, end=2)  # [1]
    s_dim = g.op("Shape", ["past_key_0"], "s_dim", start=2, end=3)  # [1]
    key_idx = g.op("Range", [zero, g.op("Squeeze", [s_dim, ax0], "s_scalar"), one], "key_idx")  # [S]
    # onnxruntime's MLAS computes a matmul whose B is not a constant differently
    # when M == 1 (a GEMV path) than when M > 1, so the attention matmuls (M = rep *
    # grp * T query rows per KV head) must never have M == 1: without GQA
    # (grp == 1) each query row is computed twice and the copy dropped.
    rep = 2 if grp == 1 else 1
    # query row g*T + t of a KV group has the position of row t: tile positions
    pos_q = g.op("Tile", [g.op("Unsqueeze", ["positions", g.i64("axes13", [1, 3])], "pos_b1t1"), g.i64("tile_grp", [1, 1, rep * grp, 1])], "pos_q")
    visible = g.op("LessOrEqual", [key_idx, pos_q], "visible")  # [B, 1, rep*grp*T, S]: key j iff j <= position
    mask = g.op("Where", [visible, g.init("zero_f", f32(0.0)), neg_inf], "mask")  # added to the scores
    # ScatterND indices (b, kv head, position) of each new row's K/V: [B, T, nkv, 3]
    b_range = g.op("Range", [zero, g.op("Squeeze", [b_dim, ax0], "b_scalar"), one], "b_range")
    idx_shape = g.op("Concat", [b_dim, t_dim, g.i64("nkv_dim", [nkv]), g.i64("one_dim", [1])], "idx_shape", axis=0)
    b_idx = g.op("Expand", [g.op("Reshape", [b_range, g.i64("shape_b111", [-1, 1, 1, 1])], "b_col"), idx_shape], "b_idx")
    h_idx = g.op("Expand", [g.i64("h_col", np.arange(nkv).reshape(1, 1, nkv, 1)), idx_shape], "h_idx")
    p_idx = g.op("Expand", [g.op("Reshape", ["positions", g.i64("shape_0m11", [0, -1, 1, 1])], "p_col"), idx_shape], "p_idx")
    scatter_idx = g.op("Concat", [b_idx, h_idx, p_idx], "scatter_idx", axis=3)

    if rep > 1:
        q_rows = g.op("Mul", [t_dim, g.i64("grp_dim", [grp])], "q_rows")  # [1]: grp * T
        tile_rep, zero1 = g.i64("tile_rep", [1, 1, rep, 1]), g.i64("zero1", [0])
    split_qk_v = g.i64("split_qk_v", [(nh + nkv) * hd, nkv * hd])
    split_q_k = g.i64("split_q_k", [nh, nkv])
    shape_qk = g.i64("shape_qk", [0, 0, nh + nkv, hd])
    shape_kv = g.i64("shape_kv", [0, 0, nkv, hd])
    shape_groups = g.i64("shape_groups", [0, nkv, -1, hd])
    shape_heads = g.i64("shape_heads", [0, nh, -1, hd])
    shape_merge = g.i64("shape_merge", [0, 0, nh * hd])
    new_kv: list[str] = []
    for i, layer in enumerate(weights.layers):
        p = f"l{i}"
        w_qkv = matrix(f"{p}.w_qkv", np.concatenate([layer.wq, layer.wk, layer.wv], axis=0))  # [H, (nh+2nkv)hd]
        w_o = matrix(f"{p}.w_o", layer.wo)
        w_gu = matrix(f"{p}.w_gate_up", np.concatenate([layer.w_gate, layer.w_up], axis=0))  # [H, 2F]
        w_down = matrix(f"{p}.w_down", layer.w_down)
        g.init(f"{p}.attn_norm", layer.attn_norm)
        g.init(f"{p}.ffn_norm", layer.ffn_norm)

        h = _rms_norm(g, x, f"{p}.attn_norm", eps, two, f"{p}_attn_norm")
        qk, v = g.op("Split", [g.op("MatMul", [h, w_qkv], f"{p}_qkv"), split_qk_v], f"{p}_split", n_out=2, axis=-1)
        qk = _rope(g, g.op("Reshape", [qk, shape_qk], f"{p}_qk4"), cos, sin, swap, f"{p}_qk_rot")  # [B, T, nh+nkv, hd]
        q, k = g.op("Split", [qk, split_q_k], f"{p}_q_k", n_out=2, axis=2)  # q scaled by 1/sqrt(hd)
        v = g.op("Reshape", [v, shape_kv], f"{p}_v4")  # [B, T, nkv, hd]
        new_kv += [k, v]
        caches = []
        for name, new in ((f"past_key_{i}", k), (f"past_value_{i}", v)):
            lane_cache = name  # [B, nkv, S, hd]
            if cache_inputs == "slots":
                lane_cache = g.op("Gather", [name, "lane_ids"], f"{p}_{name[5]}_lanes", axis=0)
            caches.append(g.op("ScatterND", [lane_cache, scatter_idx, new], f"{p}_{name[5]}_cache"))
        k_all, v_all = caches
        qg = g.op("Reshape", [g.op("Transpose", [q], f"{p}_q_t", perm=[0, 2, 1, 3]), shape_groups], f"{p}_q_groups")
        if rep > 1:
            qg = g.op("Tile", [qg, tile_rep], f"{p}_q_rep")
        scores = g.op("MatMul", [qg, g.op("Transpose", [k_all], f"{p}_k_t", perm=[0, 1, 3, 2])], f"{p}_scores")  # [B,nkv,rep*grp*T,S]
        probs = g.op("Softmax", [g.op("Add", [scores, mask], f"{p}_masked")], f"{p}_probs", axis=-1)
        attn = g.op("MatMul", [probs, v_all], f"{p}_attn")  # [B, nkv, rep*grp*T, hd]
        if rep > 1:
            attn = g.op("Slice", [attn, zero1, q_rows, ax2], f"{p}_attn_once")
        attn = g.op("Reshape", [g.op("Transpose", [g.op("Reshape", [attn, shape_heads], f"{p}_attn_h")], f"{p}_attn_t", perm=[0, 2, 1, 3]), shape_merge], f"{p}_attn_m")
        x = g.op("Add", [x, g.op("MatMul", [attn, w_o], f"{p}_o")], f"{p}_resid1")
        h = _rms_norm(g, x, f"{p}.ffn_norm", eps, two, f"{p}_ffn_norm")
        gate, up = g.op("Split", [g.op("MatMul", [h, w_gu], f"{p}_gu"), split_gu], f"{p}_gu_split", n_out=2, axis=-1)
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{p}_sig")], f"{p}_silu"), up], f"{p}_act")
        x = g.op("Add", [x, g.op("MatMul", [act, w_down], f"{p}_down")], f"{p}_resid2")

    # logits of the wanted rows only
    g.init("output_norm", weights.output_norm)
    rows = g.op("Gather", [g.op("Reshape", [x, g.i64("shape_rows", [-1, cfg.hidden])], "hidden_rows"), "logit_index"], "logit_hidden", axis=0)
    hn = _rms_norm(g, rows, "output_norm", eps, two, "final_norm")
    if weight_dtype == "int8":
        g.nodes.append(helper.make_node("MatMul", [hn, matrix("lm_head", weights.output_matrix())], ["logits"], name="lm_head"))
    elif weights.lm_head is None:
        g.nodes.append(helper.make_node("Gemm", [hn, "tok_embd"], ["logits"], name="lm_head", transB=1))
    else:
        g.init("lm_head", weights.lm_head)
        g.nodes.append(helper.make_node("Gemm", [hn, "lm_head"], ["logits"], name="lm_head", transB=1))
    # new_kv: [B, T, 2 * layers * nkv, hd] -> [B, T, layers, 2, nkv, hd] -> [layers, 2, B, T, nkv, hd]
    stacked = g.op("Concat", new_kv, "kv_cat", axis=2)
    kv_shape = g.op("Concat", [ids_shape, g.i64("kv_tail", [cfg.n_layers, 2, nkv, hd])], "kv_shape", axis=0)
    kv6 = g.op("Reshape", [stacked, kv_shape], "kv6")
    g.nodes.append(helper.make_node("Transpose", [kv6], ["new_kv"], name="new_kv", perm=[2, 3, 0, 1, 4, 5]))

    S = max_context + 1 if max_context is not None else "cache_len"
    if cache_inputs == "slots":
        cache_shape = [max_lanes if max_lanes is not None else "max_lanes", nkv, S, hd]
    else:
        cache_shape = ["batch", nkv, S, hd]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "rows"]),
        helper.make_tensor_value_info("positions", TensorProto.INT64, ["batch", "rows"]),
        helper.make_tensor_value_info("logit_index", TensorProto.INT64, ["logit_rows"]),
    ]
    if cache_inputs == "slots":
        inputs.insert(2, helper.make_tensor_value_info("lane_ids", TensorProto.INT64, ["batch"]))
    for i in range(cfg.n_layers):
        inputs.append(helper.make_tensor_value_info(f"past_key_{i}", TensorProto.FLOAT, cache_shape))
        inputs.append(helper.make_tensor_value_info(f"past_value_{i}", TensorProto.FLOAT, cache_shape))
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["logit_rows", cfg.vocab]),
        helper.make_tensor_value_info("new_kv", TensorProto.FLOAT, [cfg.n_layers, 2, "batch", "rows", nkv, hd]),
    ]
    graph = helper.make_graph(g.nodes, "llama_decoder", inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="sf_trt.export.decoder")
    model.ir_version = min(model.ir_version, 10)
    return _declare_decoder_ranges(model, cfg, max_lanes, max_context)


DECODER_MAX_LANES = 2**16
"""The lane count the decoder graph states as its bound when ``max_lanes`` is not fixed."""


def _declare_decoder_ranges(model: onnx.ModelProto, cfg: LlamaConfig, max_lanes: int | None, max_context: int | None) -> onnx.ModelProto:
    """The ranges the graph's integer inputs and symbolic dims keep (sf_trt.graph_ranges): the
    proof that its integer arithmetic (the ``Range``s over lanes and cache slots) is exact."""
    lanes = max_lanes or DECODER_MAX_LANES
    slots = (max_context or cfg.context_length) + 1  # the trash slot included
    inputs = {"input_ids": (0, cfg.vocab - 1), "positions": (0, slots - 1), "logit_index": (0, lanes * slots - 1)}
    if "lane_ids" in {i.name for i in model.graph.input}:
        inputs["lane_ids"] = (0, lanes - 1)
    dims = {"batch": (1, lanes), "rows": (1, slots), "logit_rows": (1, lanes * slots), "cache_len": (1, slots), "max_lanes": (1, lanes)}
    return declare_ranges(model, inputs=inputs, dims=dims)


def pass_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """The ``"pass"`` form of a ``"slots"`` decoder graph: no ``lane_ids``, the
    caches of the pass's lanes as inputs (see the module docstring).

    Works on the graph alone (initializers are shared, never copied), so it can
    be applied to a graph loaded without its external data.
    """
    graph = model.graph
    if "lane_ids" not in {i.name for i in graph.input}:
        raise ValueError("pass_form: the graph has no lane_ids input (already the pass form?)")
    caches = {i.name for i in graph.input if i.name.startswith(("past_key_", "past_value_"))}
    gathers = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in caches}
    out = onnx.ModelProto()
    out.ir_version, out.producer_name = model.ir_version, model.producer_name
    out.opset_import.extend(model.opset_import)
    g = out.graph
    g.name = graph.name
    g.initializer.extend(graph.initializer)
    for node in graph.node:
        if node.output[0] in gathers:
            continue
        new = g.node.add()
        new.CopyFrom(node)
        for k, name in enumerate(new.input):
            if name in gathers:
                new.input[k] = gathers[name]
    for vi in graph.input:
        if vi.name == "lane_ids":
            continue
        new = g.input.add()
        new.CopyFrom(vi)
        if vi.name in caches:
            new.type.tensor_type.shape.dim[0].Clear()
            new.type.tensor_type.shape.dim[0].dim_param = "batch"
    g.output.extend(graph.output)
    out.metadata_props.extend(model.metadata_props)
    return out


# -- the numpy float64 reference ---------------------------------------------------------


def reference_forward(
    cfg: LlamaConfig,
    weights: LlamaWeights,
    tokens,
    positions=None,
    *,
    rope: str = "interleaved",
) -> np.ndarray:
    """Float64 logits ``[n, vocab]`` of a causal pass over ``tokens`` (one sequence).

    ``positions`` default to ``0..n-1``. ``rope="interleaved"`` is the convention
    the GGUF q/k rows need; ``"half"`` (HF's ``rotate_half``) is there to show the
    other one is wrong for them (and right after :func:`unpermute_rotary_rows`).
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    n = tokens.shape[0]
    pos = np.arange(n) if positions is None else np.asarray(positions, dtype=np.int64)
    nh, nkv, hd, grp = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.group
    half = hd // 2
    inv_freq = cfg.rope_theta ** (-np.arange(half, dtype=np.float64) * 2.0 / hd)
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # [n, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rot(x: np.ndarray) -> np.ndarray:  # x [n, heads, hd]
        if rope == "interleaved":
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2] = a * c - b * s
            out[..., 1::2] = a * s + b * c
            return out
        if rope == "half":
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
        raise ValueError(f"reference_forward: rope must be 'interleaved' or 'half' (got {rope!r})")

    def norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.rms_eps) * w.astype(np.float64)

    def lin(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x @ w.astype(np.float64).T

    causal = pos[None, :] <= pos[:, None]  # [query, key]
    x = weights.tok_embd[tokens].astype(np.float64)
    for layer in weights.layers:
        h = norm(x, layer.attn_norm)
        q = rot(lin(h, layer.wq).reshape(n, nh, hd))
        k = rot(lin(h, layer.wk).reshape(n, nkv, hd))
        v = lin(h, layer.wv).reshape(n, nkv, hd)
        k, v = np.repeat(k, grp, axis=1), np.repeat(v, grp, axis=1)  # q head h uses kv head h // grp
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd)
        scores = np.where(causal[None], scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, nh * hd)
        x = x + lin(attn, layer.wo)
        h = norm(x, layer.ffn_norm)
        gate = lin(h, layer.w_gate)
        x = x + lin(gate / (1.0 + np.exp(-gate)) * lin(h, layer.w_up), layer.w_down)
    return lin(norm(x, weights.output_norm), weights.output_matrix())


# -- the model directory ------------------------------------------------------------------


def file_digest(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """sha256 hex digest of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_model_dir(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``config.json`` of an exported model directory (ValueError if incomplete)."""
    d = Path(model_dir)
    cfg_path = d / CONFIG_FILE
    if not cfg_path.is_file():
        raise ValueError(f"{d}: no {CONFIG_FILE} (expected a model directory written by export_model_dir)")
    meta = json.loads(cfg_path.read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"{cfg_path}: format {meta.get('format')!r}, expected {FORMAT_VERSION}")
    for name in meta.get("files", []):
        if not (d / name).is_file():
            raise ValueError(f"{d}: {name} is missing (the export is incomplete)")
    return meta


def _graph_facts(cfg: LlamaConfig) -> dict[str, Any]:
    return {
        "opset": OPSET,
        "graphs": {GRAPH_FILE: "slots", PASS_GRAPH_FILE: "pass"},
        "inputs": list(INPUTS) + ["past_key_{i}", "past_value_{i}"],
        "outputs": list(OUTPUTS),
        "cache_layout": "[max_lanes (slots form) or batch (pass form), n_kv_heads, max_context + 1, head_dim] float32; position max_context is the trash slot",
        "new_kv_layout": "[n_layers, 2 (key, value), batch, rows, n_kv_heads, head_dim] float32",
        "padding_position": "max_context",
        "rope": "interleaved pairs (GGUF q/k row order)",
        "max_positions": cfg.context_length,
        "dynamic_dims": ["batch", "rows", "logit_rows", "max_lanes", "cache_len"],
    }


def write_model_dir(
    out_dir: str | os.PathLike,
    cfg: LlamaConfig,
    model: onnx.ModelProto,
    tokenizer: Any = None,
    source: dict[str, Any] | None = None,
    weight_dtype: str = "float32",
) -> Path:
    """Write a model directory: the graph ``model`` (slots form, weights as
    external data), its pass form, ``config.json`` and, when given, the tokenizer files. Written into a temporary directory beside
    ``out_dir`` and renamed into place, so an interrupted write never leaves a
    half-written model behind. ``source`` is recorded as ``config.json["gguf"]``."""
    if "lane_ids" not in {i.name for i in model.graph.input}:
        raise ValueError("write_model_dir: expected the slots form of the decoder graph (build_decoder_graph's default)")
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        onnx.save_model(
            model, str(tmp / GRAPH_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
            location=DATA_FILE, size_threshold=1024,
        )
        # the pass form references the same weight file (its initializers now point there)
        onnx.save_model(pass_form(onnx.load(str(tmp / GRAPH_FILE), load_external_data=False)), str(tmp / PASS_GRAPH_FILE))
        if tokenizer is not None:
            tokenizer.save(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
        files = sorted(p.name for p in tmp.iterdir())
        for name in files:
            os.chmod(tmp / name, 0o666 & ~umask)
        meta = {
            "format": FORMAT_VERSION,
            "llama": cfg.to_dict(),
            "graph": _graph_facts(cfg),
            "weights": weight_dtype,
            "gguf": source or {},
            "files": files + [CONFIG_FILE],
        }
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        os.chmod(tmp / CONFIG_FILE, 0o666 & ~umask)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_model_dir(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, progress: bool = True, *, weight_dtype: str = "float32"
) -> Path:
    """Write (or reuse) an onnxruntime/TensorRT-ready model directory for a GGUF.

    ``out_dir`` gets ``decoder.onnx`` + ``decoder.onnx.data`` (float32 weights,
    external data), ``config.json`` (the :class:`LlamaConfig`, the graph's facts,
    the GGUF's sha256), ``tokenizer.json`` / ``tokenizer_config.json`` /
    ``chat_template.jinja``. A directory whose recorded GGUF digest and weight
    dtype match and whose files are all present is reused as it is (see
    :func:`write_model_dir`). ``weight_dtype``: ``"float32"`` (the GGUF's values
    exactly) or ``"int8"`` (see :func:`build_decoder_graph`).
    """
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"export_model_dir: weight_dtype {weight_dtype!r} unknown (known: {', '.join(WEIGHT_DTYPES)})")
    from sf_trt.tokenizer import Tokenizer

    from .gguf_llama import load_gguf, open_reader

    out = Path(out_dir)
    say = (lambda msg: print(f"sf_trt: {msg}", flush=True)) if progress else (lambda msg: None)
    digest = file_digest(gguf_path)
    try:
        meta = read_model_dir(out)
        if meta.get("gguf", {}).get("sha256") == digest and meta.get("weights", "float32") == weight_dtype:
            return out
        say(f"{out}: built from another GGUF or weight dtype; rebuilding")
    except (ValueError, json.JSONDecodeError):
        pass
    t0 = time.perf_counter()
    say(f"reading {gguf_path}")
    reader = open_reader(gguf_path)
    cfg, weights = load_gguf(reader, progress=progress)
    tok = Tokenizer.from_gguf(reader)
    say(f"building the decoder graph ({cfg.n_layers} layers, hidden {cfg.hidden}, vocab {cfg.vocab})")
    model = build_decoder_graph(cfg, weights, weight_dtype=weight_dtype)
    del weights
    source = {"path": str(Path(gguf_path).resolve()), "sha256": digest, "name": _field_or(reader, "general.name")}
    write_model_dir(out, cfg, model, tok, source, weight_dtype)
    say(f"exported {out} in {time.perf_counter() - t0:.1f}s")
    return out


def _field_or(reader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()

"""The decoder (Llama and the families declared over it) as one ONNX graph whose rows come out the same in any pass.

Exactness is the product: speculative decoding emits bit-identical tokens to
plain decoding only if **row r of a pass is bit-identical whatever the number of
rows in the pass and whichever other lanes share it**. So every reduction a row
goes through has a length and a layout that do not depend on the pass:

* matmuls reduce over the model's fixed dims (hidden, ffn, head_dim);
* attention reduces over the whole cache length ``S = max_context + 1`` (the pass
  form: over the pass's key extent, see *Key extent*), every
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
cache slots, ``S = max_context + 1``; ``C`` the compute type, see *Precision*)::

    input_ids    int64 [B, T]
    positions    int64 [B, T]      absolute position of each row; padding rows use
                                   S - 1 (= max_context, the trash slot)
    lane_ids     int64 [B]         cache slot of each lane of the pass
    logit_index  int64 [K]         flat rows b * T + t whose logits are wanted
    past_key_i   C [L, n_kv_heads, S, head_dim]   (one pair per layer i;
    past_value_i C [L, n_kv_heads, S, head_dim]    read only; the pass form:
                                                  [B, n_kv_heads, E, head_dim])

That is the ``"slots"`` form (the default, and what TensorRT engines are built
from: the caches stay bound whole, the graph gathers the pass's lanes). The
``"pass"`` form (:func:`pass_form`) drops ``lane_ids`` and takes the pass's
lanes' caches directly, ``past_key_i [B, n_kv_heads, E, head_dim]``, lane b's at
b, ``E`` (the dim ``cache_len``) the pass's key extent (*Key extent*), and reads
them whole. onnxruntime's CPU ScatterND always copies its input (its kernel is not
declared in-place), so on the CPU the gathered form costs two copies of every
lane's cache per layer and the pass form one, ScatterND's; the onnxruntime backend
runs the pass form over zero-copy views of its host cache, which it holds at the
extent its lanes need. A model directory holds both
(``decoder.onnx``, ``decoder_pass.onnx``), sharing one weight file.

Outputs::

    logits  float32 [K, vocab]     hidden rows gathered by logit_index *before* the
                                   final norm and the lm_head, so prefill rows cost
                                   no lm_head
    new_kv  C [n_layers, 2, B, T, n_kv_heads, head_dim]  this pass's K (0)
                                   and V (1), post-rotary; the host writes row
                                   (b, t) into its cache at (lane_ids[b], :,
                                   positions[b, t], :), skipping padding rows

A real row at position ``p < max_context`` sees keys ``j <= p``; a padding row
(position ``max_context``) sees everything, and its output is thrown away.
``B``, ``L`` and ``S`` are symbolic unless given, so one exported graph
serves any ``max_lanes`` / ``max_context`` up to the model's context length.
The dims are named ``batch``, ``rows_per_lane``, ``logit_rows``, ``max_lanes`` and
``cache_len`` (roles in :data:`sf_trt.formats.shapes.DIM_ROLES`).

Precision (``precision="fp32" | "fp16" | "bf16"``, recorded in the metadata under
:data:`~sf_trt.formats.model_dir.PRECISION_KEY`) lives in the graph, where a strongly
typed TensorRT network takes it as written: the compute type ``C`` is that of the
weights (the token embedding included), every matmul, the rotary tables, the KV cache
and ``new_kv``. What precision needs stays float32 by explicit ``Cast``: the residual
stream (embedding rows are cast up, every block's output is cast up before it is
added), RMSNorm (computed on the float32 stream, cast to ``C`` after its weight),
the attention scores from the ``QK^T`` matmul on (mask and softmax; the
probabilities are cast to ``C`` for the ``PV`` matmul) and the logits. With
``precision="fp32"`` there is no ``Cast`` at all. ``weight_dtype="int8"`` keeps
``DequantizeLinear`` (to float32) and casts its output to ``C``.

Key extent. The pass form (the graph onnxruntime runs) reads keys ``0 .. E - 1``, ``E``
the length of the caches bound to it, which the runtime chooses:
:mod:`sf_trt.backends.ort_decoder` binds its lanes' caches at the pass's largest position
plus one rounded up to its ``KEY_BLOCK`` (64), at most ``S`` (or at the length its host
arrays hold, when that is less than twice as long), so a pass costs what its positions need,
not the window, and the graph copies nothing to get there. (Until model-directory format 13
the graph sliced ``E`` out of caches bound at ``S``: a second copy per layer.) Every
position the pass writes must lie below ``E``. A row at position ``p``
reads the same keys ``0 .. p`` whatever ``E`` is; the keys from ``p + 1`` to ``E - 1``
get ``-inf``, so their softmax weights are exactly 0 and their products in the ``PV``
matmul exactly 0, and adding an exact 0 changes no partial sum. What could change a
row's bits is where its real keys fall in the kernels' vector loops: they start at key
0 for every ``E``, and ``E`` is a multiple of every vector width onnxruntime's CPU
kernels step by, so the real keys take the vector path at every extent
(``tests/backends/test_row_independence.py``: extents from 64 to the whole window, the
tiny model at two optimization levels and 1/2 threads, and the real model;
``tests/backends/test_ort_decoder.py``: the host arrays grown and shrunk mid-conversation).
Padding rows count too: the onnxruntime backend puts them at the positions right after their
lane's rows (capped at the trash slot ``S - 1``), which raises ``E`` by at most the
pass's rows per lane. The ``slots`` form (TensorRT's engines, one fixed shape) reads ``S`` keys.
Threads. MLAS chunks a GEMM's sums by how it splits the GEMM among threads, so onnxruntime's
CPU backend runs the attention rewritten to sum in the same chunks in every pass and at any
thread count (:mod:`sf_trt.graphs.ort_attention`); the graphs here stay opset 17.
Tried for the copy ScatterND still makes, and dropped: onnxruntime's ``GroupQueryAttention``
(writes a shared cache buffer, but refuses passes of several lanes with several rows each, and
its one-row path is not row-exact: MLAS takes another path at M == 1) and opset 23's
``Attention`` (bit-identical, and it reads the scattered copy too; onnxruntime's CPU backend runs
it now for the reason under *Threads*).

Weights (``weight_dtype``): ``"float32"`` (the GGUF dequantized), ``"int8"`` (per-channel
int8, ``DequantizeLinear``) or ``"q4"``: every layer matrix in 4 bits per block of 32 in
onnxruntime's contrib ``MatMulNBits`` (a float32 scale per block, int8 compute at accuracy
level 4), one per matrix. The GGUF's own Q4_0, Q4_1 and Q4_K blocks go in as they are
(:mod:`sf_trt.export.quantize`); Q4_1's and Q4_K's per-block offsets enter as each block's
input sum times the offset, the block sums coming out of the same ``MatMulNBits`` (indicator
rows). Other matrices are requantized with a uint8 zero point per block, which ``MatMulNBits``
takes as an input. The embedding and lm_head are Q8_0 blocks (the GGUF's own, or quantized to
Q8_0; an 8-bit ``MatMulNBits``). ``"gguf"``: the same, but each matrix in its own GGUF blocks
with no value changed (:func:`~sf_trt.export.quantize.gguf_bits`): 4 bits where every part of
it is Q4_0, Q4_1 or Q4_K, else 8 bits (Q5_0, Q5_1, Q5_K, Q6_K and Q8_0 exactly; Q6_K in
blocks of 16; F16/F32 quantized to Q8_0). ``"int4"``: every matrix requantized to 4 bits with a
uint8 zero point per block, the GGUF's own 4-bit blocks and the lm_head (untied from a tied embedding)
included, so no matrix has offsets (onnxruntime-genai's int4 form); the embedding a Q8_0 table as with
q4. A q4, int4 or gguf graph runs on onnxruntime only.

Rotary convention: the GGUF q/k rows are in llama.cpp's interleaved order (see
:mod:`sf_trt.export.gguf_llama`), so each adjacent pair ``(2i, 2i+1)`` is rotated:
``out = x * cos + swap_pairs(x) * sin_signed``.

Families (:mod:`sf_trt.export.families`) are declared differences over this one graph, each
a few nodes where the family has them: biases added after their matmul; q/k heads RMSNorm'd
(float32, one weight row per head) before the rotation; the attention's and the MLP's outputs
RMSNorm'd before their residual add; a GELU (tanh) gate; embedding rows times ``sqrt(hidden)``;
q scaled by ``cfg.scale`` (``query_pre_attn_scalar``) in the rotary rows; Llama 3's rope divisors
in the rotary tables; and on the sliding layers a second mask, ``-inf`` on keys
``j <= p - window`` too, with their own rotary table where their rope base differs. The window
is a mask over the lane's one contiguous cache, so a row still reads keys ``0 ..`` at their
absolute positions and stays bit-identical however a pass is packed.

Ops (default domain, opset 17): Gather, MatMul, Gemm, Split, Reshape, Transpose,
Mul, Add, Div, Pow, Sqrt, ReduceMean, Sigmoid, Softmax, Where, LessOrEqual,
ScatterND, Shape, Range, Unsqueeze, Expand, Concat, Tile (and Slice without GQA;
Tanh with a GELU gate; Sub and Greater with a sliding window;
DequantizeLinear with int8 weights; Cast below fp32; ArgMax and Constant in the
pass form). No TopK, no bitwise ops; contrib ops (``MatMulNBits``) only with q4 or gguf weights.

onnxruntime's fused ops. Both forms are written in that standard ONNX (TensorRT builds the slots
form; onnxruntime's CUDA and TensorRT providers run the pass form as written). onnxruntime's CPU
backend loads either form rewritten by :func:`sf_trt.graphs.ort_fusions.onnxruntime_fused` into
contrib ops (``com.microsoft``): each layer's rotation as one ``RotaryEmbedding`` for q and one for
k (Split, Reshape, the ``pair_swap`` Gather, two Mul and an Add gone), each residual Add with the
RMSNorm after it as one ``SkipSimplifiedLayerNormalization``. With those and onnxruntime's own
fusions at load (``MatMulNBits``, ``SimplifiedLayerNormalization``, ``QuickGelu``, ``FusedMatMul``) a
Llama layer runs as 26 kernels: SkipSimplifiedLayerNormalization, MatMulNBits (q|k|v), Split,
RotaryEmbedding and Reshape, Transpose, Reshape (q), RotaryEmbedding and Reshape (k), Reshape (v),
ScatterND (k, v), FusedMatMul, Add (mask), Softmax, MatMul, Reshape, Transpose, Reshape,
MatMulNBits (o), SkipSimplifiedLayerNormalization, MatMulNBits (gate|up), Split, QuickGelu, Mul,
MatMulNBits (down); 30 before (docs/benchmarks.md, "onnxruntime's fused ops in the pass form").
Then :func:`sf_trt.graphs.ort_attention.exact_attention` makes FusedMatMul, Add, Softmax and
MatMul one ``Attention`` between two Reshapes (opset 23), whose sums do not depend on the threads.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper

from sf_trt.formats.model_dir import (
    CACHE_INPUTS, INPUTS, NBITS_WEIGHT_DTYPES, OUTPUTS, PASS_OUTPUTS, PRECISION_KEY, PRECISIONS, WEIGHT_DTYPES, LlamaConfig,
    cache_names,
)
from sf_trt.graphs.builder import GraphBuilder
from sf_trt.graphs.ort_fusions import constant_node as _const
from sf_trt.graphs.ort_fusions import live_nodes as _live
from sf_trt.graphs.ranges import declare_ranges

from .families import BIAS_OF, family
from .gguf_llama import LlamaLayerWeights, LlamaWeights
from .quantize import BLOCK, Q4_HEAD_KIND, NBitsMatrix, blocks_for, nbits_for, output_bits, quantize_int8

__all__ = ["build_decoder_graph", "pass_form", "rope_tables", "inverse_frequencies", "COMPUTE_TYPES"]

MS_DOMAIN = "com.microsoft"
"""onnxruntime's contrib domain: ``MatMulNBits`` of the q4 export (an onnxruntime-only graph)."""
NBITS_WEIGHTS = NBITS_WEIGHT_DTYPES
"""The weight choices held in ``MatMulNBits`` (onnxruntime-only graphs)."""
NBITS_ACCURACY = 4
"""``MatMulNBits``' accuracy level: 4 computes in int8, activations quantized per row and
block of 32 (onnxruntime's fast CPU path; the int8 export runs the same through its fusion)."""

COMPUTE_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
"""The ONNX type of the decoder's weights, matmuls and KV cache, by precision."""


def rope_tables(cfg: LlamaConfig, length: int, theta: float | None = None, factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin_signed)`` float64 ``[length, head_dim]`` for interleaved pairs.

    ``cos[p, 2i] = cos[p, 2i+1] = cos(p * w_i)``, ``sin_signed[p, 2i] = -sin(p * w_i)``,
    ``sin_signed[p, 2i+1] = +sin(p * w_i)``, ``w_i = theta ** (-2i / head_dim) / factors[i]``
    (``theta`` default ``cfg.rope_theta``; ``factors``: Llama 3's rope divisors, default 1).
    """
    inv_freq = inverse_frequencies(cfg, theta, factors)
    angles = np.arange(length, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.repeat(np.cos(angles), 2, axis=1)
    sin = np.sin(angles)
    sin_signed = np.stack([-sin, sin], axis=-1).reshape(length, cfg.head_dim)
    return cos, sin_signed


def inverse_frequencies(cfg: LlamaConfig, theta: float | None = None, factors: np.ndarray | None = None) -> np.ndarray:
    """float64 ``[head_dim / 2]``: ``theta ** (-2i / head_dim) / factors[i]``."""
    half = cfg.head_dim // 2
    inv_freq = (theta or cfg.rope_theta) ** (-np.arange(half, dtype=np.float64) * 2.0 / cfg.head_dim)
    return inv_freq if factors is None else inv_freq / np.asarray(factors, np.float64)


def build_decoder_graph(
    cfg: LlamaConfig,
    weights: LlamaWeights,
    max_lanes: int | None = None,
    max_context: int | None = None,
    *,
    cache_inputs: str = "slots",
    weight_dtype: str = "float32",
    precision: str = "fp32",
    external_data: str | os.PathLike | None = None,
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
    computes is :func:`~sf_trt.export.quantize.int8_weights` of ``weights``.

    ``precision`` (:data:`~sf_trt.formats.model_dir.PRECISIONS`) is the compute type of
    the weights, matmuls and KV cache (module docstring, *Precision*).

    ``external_data``: a file each weight is appended to as the graph is built (ONNX external
    data, located by the file's name beside the graph): with weights that load lazily
    (:class:`~sf_trt.export.gguf_llama.LazyArray`), a build holds about one tensor at a time,
    not the model. The graph must then be saved into that file's directory.
    """
    _check_args(cfg, weights, max_lanes, max_context, cache_inputs, weight_dtype, precision)
    if cache_inputs == "pass":  # the slots form, its lanes' caches taken directly (pass_form)
        return pass_form(build_decoder_graph(
            cfg, weights, max_lanes, max_context, weight_dtype=weight_dtype, precision=precision, external_data=external_data,
        ))
    d = _Decoder(GraphBuilder(external_data), cfg, weight_dtype, cache_inputs, precision)
    d.weights = weights
    x = d.pass_inputs(weights, max_context)
    new_kv: list[str] = []
    for i, layer in enumerate(weights.layers):
        x = d.layer(i, layer, x, new_kv)
    d.head(weights, x)
    d.new_kv_output(new_kv)
    model = d.g.model(
        "llama_decoder", *_io(cfg, max_lanes, max_context, cache_inputs, precision), producer="sf_trt.export.decoder_graph",
        metadata={PRECISION_KEY: precision},
    )
    return _declare_ranges(model, cfg, max_lanes, max_context)


KEY_INDEX = "key_idx"
"""The tensor of key positions attention reads, ``[S]`` (``[E]`` in the pass form): named so that
:func:`pass_form` can replace it."""

DECODER_MAX_LANES = 2**16
"""The lane count the decoder graph states as its bound when ``max_lanes`` is not fixed."""


def _declare_ranges(model: onnx.ModelProto, cfg: LlamaConfig, max_lanes: int | None, max_context: int | None) -> onnx.ModelProto:
    """The ranges the graph's integer inputs and symbolic dims keep (sf_trt.graphs.ranges): the
    proof that its integer arithmetic (the ``Range``s over lanes and cache slots) is exact."""
    lanes = max_lanes or DECODER_MAX_LANES
    slots = (max_context or cfg.context_length) + 1  # the trash slot included
    inputs = {"input_ids": (0, cfg.vocab - 1), "positions": (0, slots - 1), "logit_index": (0, lanes * slots - 1)}
    if "lane_ids" in {i.name for i in model.graph.input}:
        inputs["lane_ids"] = (0, lanes - 1)
    dims = {"batch": (1, lanes), "rows_per_lane": (1, slots), "logit_rows": (1, lanes * slots), "cache_len": (1, slots), "max_lanes": (1, lanes)}
    return declare_ranges(model, inputs=inputs, dims=dims)


def _with_block_sums(matrix: NBitsMatrix) -> NBitsMatrix:
    """``matrix`` and ``K / block`` more rows whose row ``j`` is 1 on input block ``j`` and 0
    elsewhere (values zero + 1 and zero at the default zero point, scale 1, exact at any bits): ``x``
    times them is the sum of ``x`` over each block."""
    out, nb = matrix.scales.shape
    zero = 2 ** (matrix.bits - 1)
    q = np.full((nb, nb, matrix.block), zero, np.uint8)
    q[np.arange(nb), np.arange(nb)] = zero + 1
    zeros = None if matrix.zeros is None else np.concatenate([matrix.zeros, np.full((nb, nb), zero, np.uint8)])
    offsets = np.concatenate([matrix.offsets, np.zeros((nb, nb), np.float32)])
    return NBitsMatrix(matrix.bits, np.concatenate([matrix.q, q]), np.concatenate([matrix.scales, np.ones((nb, nb), np.float32)]), zeros, offsets)


def _check_args(cfg, weights, max_lanes, max_context, cache_inputs, weight_dtype, precision) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"build_decoder_graph: precision {precision!r} unknown (known: {', '.join(PRECISIONS)})")
    if weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"build_decoder_graph: weight_dtype {weight_dtype!r} unknown (known: {', '.join(WEIGHT_DTYPES)})")
    if cache_inputs not in CACHE_INPUTS:
        raise ValueError(f"build_decoder_graph: cache_inputs {cache_inputs!r} unknown (known: {', '.join(CACHE_INPUTS)})")
    if weight_dtype in NBITS_WEIGHTS and precision != "fp32":
        raise ValueError(f"build_decoder_graph: {weight_dtype} weights compute in onnxruntime's MatMulNBits (fp32 activations); precision {precision!r} is for float32 or int8 weights")
    weights.check(cfg)
    if max_context is not None and not 1 <= max_context <= cfg.context_length:
        raise ValueError(f"build_decoder_graph: max_context {max_context} outside 1..{cfg.context_length} (the model's context length)")
    if max_lanes is not None and max_lanes < 1:
        raise ValueError(f"build_decoder_graph: max_lanes must be >= 1 (got {max_lanes})")


class _Decoder:
    """The decoder graph under construction: what every layer shares, then each layer."""

    def __init__(self, g: GraphBuilder, cfg: LlamaConfig, weight_dtype: str, cache_inputs: str, precision: str) -> None:
        self.g, self.cfg, self.weight_dtype, self.cache_inputs = g, cfg, weight_dtype, cache_inputs
        self.fam = family(cfg.arch)  # the declared differences from llama (sf_trt.export.families)
        self.ct = COMPUTE_TYPES[precision]  # the compute type C
        self.np_ct = helper.tensor_dtype_to_np_dtype(self.ct)
        nh, nkv, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        # onnxruntime's MLAS computes a matmul whose B is not a constant differently
        # when M == 1 (a GEMV path) than when M > 1, so the attention matmuls (M = rep *
        # grp * T query rows per KV head) must never have M == 1: without GQA
        # (grp == 1) each query row is computed twice and the copy dropped.
        self.rep = 2 if cfg.group == 1 else 1
        self.eps, self.two = g.f32(cfg.rms_eps, "rms_eps"), g.f32(2.0, "two")
        self.swap = g.i64(np.arange(hd) ^ 1, "pair_swap")  # 1, 0, 3, 2, ...
        self.weights: LlamaWeights | None = None  # q4: where the GGUF's own blocks are
        self.shapes = {
            "split_gu": g.i64([cfg.ffn, cfg.ffn], "split_gu"),
            "split_qk_v": g.i64([(nh + nkv) * hd, nkv * hd], "split_qk_v"),
            "split_q_k": g.i64([nh, nkv], "split_q_k"),
            "qk": g.i64([0, 0, nh + nkv, hd], "shape_qk"),
            "kv": g.i64([0, 0, nkv, hd], "shape_kv"),
            "groups": g.i64([0, nkv, -1, hd], "shape_groups"),
            "heads": g.i64([0, nh, -1, hd], "shape_heads"),
            "merge": g.i64([0, 0, nh * hd], "shape_merge"),
        }

    def weight(self, value: np.ndarray, name: str) -> str:
        """A weight initializer in the compute type."""
        return self.g.init(np.ascontiguousarray(value, dtype=self.np_ct), name)

    def to_compute(self, x: str, stem: str) -> str:
        """``x`` (float32) cast to the compute type (itself at fp32)."""
        return x if self.ct == TensorProto.FLOAT else self.g.op("Cast", [x], f"{stem}_c", to=self.ct)

    def to_f32(self, x: str, stem: str) -> str:
        """``x`` (compute type) cast to float32 (itself at fp32)."""
        return x if self.ct == TensorProto.FLOAT else self.g.op("Cast", [x], f"{stem}_f32", to=TensorProto.FLOAT)

    def matrix(self, name: str, w: np.ndarray) -> str:
        """The ``[in, out]`` operand of ``x @ w.T`` for an ``[out, in]`` weight, in the compute type."""
        g = self.g
        if self.weight_dtype == "float32":
            return self.weight(w.T, name)
        q, scale = quantize_int8(w)
        g.init(np.ascontiguousarray(q.T), f"{name}.q")
        g.init(scale, f"{name}.scale")
        return self.to_compute(g.op("DequantizeLinear", [f"{name}.q", f"{name}.scale"], f"{name}_dq", axis=1), f"{name}_dq")

    def linear(
        self, x: str, name: str, layer: LlamaLayerWeights, i: int, fields: tuple[str, ...], residual: str | None = None,
        post_norm: str | None = None,
    ) -> str:
        """``x @ W.T`` for the layer's matrices ``fields`` stacked by output (one matmul), plus their
        biases where the layer has any, RMSNorm'd by ``post_norm`` (a float32 weight) when given, plus
        ``residual`` (the float32 stream) when given."""
        bias = _bias(layer, fields)
        plain = bias is None and post_norm is None
        if self.weight_dtype in NBITS_WEIGHTS:
            matrix = nbits_for(self.weight_dtype)(self.weights, [f"layers.{i}.{f}" for f in fields], [getattr(layer, f) for f in fields])
            y = self.nbits(x, name, matrix, residual if plain else None)
            if plain:
                return y
        else:
            w = np.concatenate([getattr(layer, f) for f in fields], axis=0) if len(fields) > 1 else np.asarray(getattr(layer, fields[0]))
            y = self.g.op("MatMul", [x, self.matrix(name, w)], f"{name}_mm")
            if plain:
                return y if residual is None else self.g.op("Add", [residual, self.to_f32(y, f"{name}_mm")], f"{name}_resid")
        if bias is not None:
            y = self.g.op("Add", [y, self.weight(bias, f"{name}.bias")], f"{name}_biased")
        if post_norm is not None:
            y = self.rms_norm(self.to_f32(y, f"{name}_out"), post_norm, f"{name}_post_norm", cast=False)
        elif residual is not None:
            y = self.to_f32(y, f"{name}_out")
        return y if residual is None else self.g.op("Add", [residual, y], f"{name}_resid")

    def nbits(self, x: str, name: str, matrix: NBitsMatrix, residual: str | None = None) -> str:
        """``x @ W.T`` (``+ residual``) for a matrix in blocks (:class:`NBitsMatrix`), as onnxruntime's
        ``MatMulNBits``, one per matrix; its zero points an input where any block's is not the default.

        Offsets (Q4_1's, Q4_K's, Q5_1's, Q5_K's): each block's input sum times its offset. The block
        sums come out of the same ``MatMulNBits``: ``K / block`` more output columns whose values are
        the zero point plus 1 inside their block and the zero point elsewhere, scale 1 (exact), so
        they are the sums of the very int8 activations the weights multiply; one small float32
        ``MatMul`` applies the offsets, added with the residual in one ``Sum``."""
        g = self.g
        n, k = matrix.shape
        nb = k // matrix.block
        if matrix.offsets is not None:
            matrix = _with_block_sums(matrix)
        b, scales = matrix.packed(), matrix.scales.reshape(-1)
        inputs = [x, g.init(b, f"{name}.q{matrix.bits}"), g.init(scales, f"{name}.scale")]
        if matrix.zeros is not None:
            inputs.append(g.init(matrix.packed_zeros(), f"{name}.zero"))
        y = g.op(
            "MatMulNBits", inputs, f"{name}_mm",
            domain=MS_DOMAIN, K=k, N=b.shape[0], bits=matrix.bits, block_size=matrix.block, accuracy_level=NBITS_ACCURACY,
        )
        if matrix.offsets is None:
            return y if residual is None else g.op("Add", [residual, y], f"{name}_resid")
        y, sums = g.op("Split", [y, g.i64([n, nb])], f"{name}_split", n_out=2, axis=-1)
        off = g.op("MatMul", [sums, g.init(np.ascontiguousarray(matrix.offsets[:n].T), f"{name}.offset")], f"{name}_offsets")
        return g.op("Sum", [y, off] + ([residual] if residual is not None else []), f"{name}_q41")

    def rms_norm(self, x: str, weight: str, stem: str, cast: bool = True) -> str:
        """RMSNorm of the float32 rows ``x`` over the last axis, in float32, cast to the compute type
        after its weight (kept float32 when not ``cast``)."""
        # Pow -> ReduceMean -> Add -> Sqrt -> Div -> Mul: the pattern onnxruntime fuses.
        g = self.g
        ms = g.op("ReduceMean", [g.op("Pow", [x, self.two], f"{stem}_sq")], f"{stem}_ms", axes=[-1], keepdims=1)
        rms = g.op("Sqrt", [g.op("Add", [ms, self.eps], f"{stem}_mseps")], f"{stem}_rms")
        y = g.op("Mul", [g.op("Div", [x, rms], f"{stem}_normed"), weight], stem if cast else f"{stem}_f32")
        return self.to_compute(y, stem) if cast else y

    def activation(self, x: str, stem: str) -> str:
        """The family's activation of the gate rows ``x`` (compute type)."""
        g = self.g
        if self.fam.activation == "silu":
            return g.op("Mul", [x, g.op("Sigmoid", [x], f"{stem}_sig")], f"{stem}_silu")
        # GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
        c = {k: g.init(np.asarray(v, self.np_ct)) for k, v in (("c", np.sqrt(2.0 / np.pi)), ("k", 0.044715), ("half", 0.5), ("one", 1.0))}
        cube = g.op("Mul", [g.op("Mul", [x, x], f"{stem}_x2"), x], f"{stem}_x3")
        inner = g.op("Mul", [g.op("Add", [x, g.op("Mul", [cube, c["k"]], f"{stem}_kx3")], f"{stem}_poly"), c["c"]], f"{stem}_inner")
        t = g.op("Add", [g.op("Tanh", [inner], f"{stem}_tanh"), c["one"]], f"{stem}_1t")
        return g.op("Mul", [g.op("Mul", [x, c["half"]], f"{stem}_halfx"), t], f"{stem}_gelu")

    def embedding(self, weights: LlamaWeights) -> str:
        """The pass's rows of the token embedding, float32 ``[B, T, H]``. With q4 weights the
        table is the Q8_0 blocks (shared with a tied lm_head), dequantized row by row as
        gathered: ``(b - 128) * d``, exactly the GGUF's values."""
        g = self.g
        if self.weight_dtype not in NBITS_WEIGHTS:
            self.weight(weights.tok_embd, "tok_embd")
            return self.scaled(self.to_f32(g.op("Gather", ["tok_embd", "input_ids"], "embed", axis=0), "embed"))
        table = blocks_for(weights, ["tok_embd"], weights.tok_embd, Q4_HEAD_KIND).nbits()
        b, scales = table.packed(), table.scales.reshape(-1)  # [V, nb, 32] uint8, [V * nb]
        nb = b.shape[1]
        g.init(b, "tok_embd.q8")
        g.init(scales, "tok_embd.scale")
        q = g.op("Cast", [g.op("Gather", ["tok_embd.q8", "input_ids"], "embed_q", axis=0)], "embed_qf", to=TensorProto.FLOAT)  # [B, T, nb, 32]
        d = g.op("Gather", [g.op("Reshape", ["tok_embd.scale", g.i64([-1, nb, 1])], "embed_scales"), "input_ids"], "embed_d", axis=0)  # [B, T, nb, 1]
        rows = g.op("Mul", [g.op("Sub", [q, g.f32(128.0)], "embed_centred"), d], "embed_blocks")
        return self.scaled(g.op("Reshape", [rows, g.i64([0, 0, self.cfg.hidden])], "embed"))

    def scaled(self, x: str) -> str:
        """The float32 embedding rows, times ``sqrt(hidden)`` in a family that scales them (Gemma)."""
        if not self.fam.embed_scale:
            return x
        return self.g.op("Mul", [x, self.g.f32(float(np.float32(np.sqrt(self.cfg.hidden))), "embed_scale")], "embed_scaled")

    def rope(self, x: str, stem: str, local: bool = False) -> str:
        """x [B, T, heads, hd] rotated pairwise by position (cos/sin [B, T, heads, hd]); ``local``: with
        the sliding layers' own table."""
        g = self.g
        cos, sin = self.local_rope if local and self.local_rope else (self.cos, self.sin)
        swapped = g.op("Gather", [x, self.swap], f"{stem}_swap", axis=3)
        return g.op("Add", [g.op("Mul", [x, cos], f"{stem}_c"), g.op("Mul", [swapped, sin], f"{stem}_s")], stem)

    def head_norm(self, qk: str, layer: LlamaLayerWeights, p: str) -> str:
        """Per-head RMSNorm of the q and k heads ``qk`` [B, T, nh + nkv, hd] (compute type), before the
        rotation: in float32, each head by its own weight row."""
        cfg = self.cfg
        w = np.concatenate([np.tile(layer.q_norm, (cfg.n_heads, 1)), np.tile(layer.k_norm, (cfg.n_kv_heads, 1))])
        self.g.init(np.ascontiguousarray(w, np.float32), f"{p}.qk_norm")
        return self.rms_norm(self.to_f32(qk, f"{p}_qk4"), f"{p}.qk_norm", f"{p}_qk_norm")

    def pass_inputs(self, weights: LlamaWeights, max_context: int | None) -> str:
        """What every layer shares: embeddings, rotary rows, the mask, scatter indices.
        Returns the embedded rows ``[B, T, H]``."""
        g, cfg = self.g, self.cfg
        nh, nkv, hd, grp = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.group
        table_len = (cfg.context_length if max_context is None else max_context) + 1
        tables = {"rope": rope_tables(cfg, table_len, factors=weights.rope_factors)}
        if cfg.sliding_layers and cfg.rope_local_theta and cfg.rope_local_theta != cfg.rope_theta:
            tables["rope_local"] = rope_tables(cfg, table_len, theta=cfg.rope_local_theta)
        for stem, (cos_tab, sin_tab) in tables.items():
            self.weight(cos_tab, f"{stem}_cos")
            self.weight(sin_tab, f"{stem}_sin")
        neg_inf = g.f32(-np.inf, "neg_inf")
        zero, one = g.i64(0, "zero"), g.i64(1, "one")
        self.ax2 = ax2 = g.i64([2], "axis2")
        x = self.embedding(weights)  # [B, T, H] float32
        # rotary rows for q and k heads at once, the attention scale folded into q's
        head_scale = self.weight(np.r_[np.full(nh, cfg.scale), np.ones(nkv)].reshape(nh + nkv, 1), "head_scale")
        rows = {
            stem: tuple(
                g.op("Mul", [g.op("Unsqueeze", [g.op("Gather", [f"{stem}_{f}", "positions"], f"{stem}_{f}_rows", axis=0), ax2], f"{stem}_{f}_1"), head_scale], f"{stem}_{f}")
                for f in ("cos", "sin")
            )
            for stem in tables
        }
        self.cos, self.sin = rows["rope"]
        self.local_rope = rows.get("rope_local")
        self.ids_shape = g.op("Shape", ["input_ids"], "ids_shape")
        b_dim = g.op("Shape", ["input_ids"], "b_dim", start=0, end=1)  # [1]
        self.t_dim = t_dim = g.op("Shape", ["input_ids"], "t_dim", start=1, end=2)  # [1]
        if max_context is None:  # S symbolic: the key index from the cache's shape
            s_scalar = g.op("Gather", [g.op("Shape", ["past_key_0"], "cache_shape"), g.i64(2, "two_i")], "s_scalar", axis=0)  # []
            key_idx = g.named("Range", [zero, s_scalar, one], KEY_INDEX)  # [S]
        else:  # a constant (onnxruntime's shape inference refuses a Range over a static shape's dim)
            key_idx = g.i64(np.arange(max_context + 1), KEY_INDEX)  # [S]
        # query row g*T + t of a KV group has the position of row t: tile positions
        pos_b1t1 = g.op("Unsqueeze", ["positions", g.i64([1, 3], "axes13")], "pos_b1t1")
        pos_q = g.op("Tile", [pos_b1t1, g.i64([1, 1, self.rep * grp, 1], "tile_grp")], "pos_q")
        visible = g.op("LessOrEqual", [key_idx, pos_q], "visible")  # [B, 1, rep*grp*T, S]: key j iff j <= position
        self.mask = g.op("Where", [visible, g.f32(0.0, "zero_f"), neg_inf], "mask")  # added to the scores
        if cfg.sliding_layers:  # and key j only iff j > position - window: the same cache, more -inf
            in_window = g.op("Greater", [key_idx, g.op("Sub", [pos_q, g.i64(cfg.sliding_window, "window")], "window_start")], "in_window")
            self.local_mask = g.op("Where", [in_window, self.mask, neg_inf], "local_mask")
        # ScatterND indices (b, kv head, position) of each new row's K/V: [B, T, nkv, 3]
        b_range = g.op("Range", [zero, g.op("Gather", [self.ids_shape, zero], "b_scalar", axis=0), one], "b_range")
        idx_shape = g.op("Concat", [b_dim, t_dim, g.i64([nkv], "nkv_dim"), g.i64([1], "one_dim")], "idx_shape", axis=0)
        b_idx = g.op("Expand", [g.op("Reshape", [b_range, g.i64([-1, 1, 1, 1], "shape_b111")], "b_col"), idx_shape], "b_idx")
        h_idx = g.op("Expand", [g.i64(np.arange(nkv).reshape(1, 1, nkv, 1), "h_col"), idx_shape], "h_idx")
        p_idx = g.op("Expand", [g.op("Reshape", ["positions", g.i64([0, -1, 1, 1], "shape_0m11")], "p_col"), idx_shape], "p_idx")
        self.scatter_idx = g.op("Concat", [b_idx, h_idx, p_idx], "scatter_idx", axis=3)
        if self.rep > 1:
            self.q_rows = g.op("Mul", [t_dim, g.i64([grp], "grp_dim")], "q_rows")  # [1]: grp * T
            self.tile_rep, self.zero1 = g.i64([1, 1, self.rep, 1], "tile_rep"), g.i64([0], "zero1")
        return x

    def layer(self, i: int, layer: LlamaLayerWeights, x: str, new_kv: list[str]) -> str:
        """One decoder layer over the rows ``x`` ``[B, T, H]``; appends its K and V to ``new_kv``."""
        g, shapes, p, local = self.g, self.shapes, f"l{i}", self.cfg.slides(i)
        norms = [n for n in ("attn_norm", "ffn_norm", "post_attn_norm", "post_ffn_norm") if getattr(layer, n) is not None]
        for n in norms:  # norm weights stay float32, as the norm does
            g.init(getattr(layer, n), f"{p}.{n}")

        h = self.rms_norm(x, f"{p}.attn_norm", f"{p}_attn_norm")
        qk, v = g.op("Split", [self.linear(h, f"{p}.w_qkv", layer, i, ("wq", "wk", "wv")), shapes["split_qk_v"]], f"{p}_split", n_out=2, axis=-1)
        qk = g.op("Reshape", [qk, shapes["qk"]], f"{p}_qk4")  # [B, T, nh+nkv, hd]
        if layer.q_norm is not None:
            qk = self.head_norm(qk, layer, p)
        qk = self.rope(qk, f"{p}_qk_rot", local)
        q, k = g.op("Split", [qk, shapes["split_q_k"]], f"{p}_q_k", n_out=2, axis=2)  # q scaled by cfg.scale
        v = g.op("Reshape", [v, shapes["kv"]], f"{p}_v4")  # [B, T, nkv, hd]
        new_kv += [k, v]
        caches = []
        for name, new in zip(cache_names(i), (k, v)):
            lane_cache = name  # [B, nkv, S, hd]
            if self.cache_inputs == "slots":
                lane_cache = g.op("Gather", [name, "lane_ids"], f"{p}_{name[5]}_lanes", axis=0)
            caches.append(g.op("ScatterND", [lane_cache, self.scatter_idx, new], f"{p}_{name[5]}_cache"))
        k_all, v_all = caches
        qg = g.op("Reshape", [g.op("Transpose", [q], f"{p}_q_t", perm=[0, 2, 1, 3]), shapes["groups"]], f"{p}_q_groups")
        if self.rep > 1:
            qg = g.op("Tile", [qg, self.tile_rep], f"{p}_q_rep")
        attn = self.attend(qg, k_all, v_all, self.local_mask if local else self.mask, p)  # [B, nkv, rep*grp*T, hd]
        if self.rep > 1:
            attn = g.op("Slice", [attn, self.zero1, self.q_rows, self.ax2], f"{p}_attn_once")
        attn = g.op("Reshape", [g.op("Transpose", [g.op("Reshape", [attn, shapes["heads"]], f"{p}_attn_h")], f"{p}_attn_t", perm=[0, 2, 1, 3]), shapes["merge"]], f"{p}_attn_m")
        post_attn = f"{p}.post_attn_norm" if layer.post_attn_norm is not None else None
        x = self.linear(attn, f"{p}.w_o", layer, i, ("wo",), residual=x, post_norm=post_attn)  # float32 stream
        h = self.rms_norm(x, f"{p}.ffn_norm", f"{p}_ffn_norm")
        gate, up = g.op("Split", [self.linear(h, f"{p}.w_gate_up", layer, i, ("w_gate", "w_up")), shapes["split_gu"]], f"{p}_gu_split", n_out=2, axis=-1)
        act = g.op("Mul", [self.activation(gate, p), up], f"{p}_act")
        post_ffn = f"{p}.post_ffn_norm" if layer.post_ffn_norm is not None else None
        return self.linear(act, f"{p}.w_down", layer, i, ("w_down",), residual=x, post_norm=post_ffn)

    def attend(self, q: str, keys: str, values: str, mask: str, p: str) -> str:
        """``softmax(q k^T + mask) v`` over every kv head at once: ``q`` ``[B, nkv, R, hd]``,
        ``keys``/``values`` ``[B, nkv, S, hd]``; returns ``[B, nkv, R, hd]`` (onnxruntime's CPU
        backend runs it as :mod:`sf_trt.graphs.ort_attention` rewrites it)."""
        g = self.g
        scores = g.op("MatMul", [q, g.op("Transpose", [keys], f"{p}_k_t", perm=[0, 1, 3, 2])], f"{p}_scores")  # [B, nkv, R, S]
        scores = self.to_f32(scores, f"{p}_scores")  # mask and softmax in float32
        probs = g.op("Softmax", [g.op("Add", [scores, mask], f"{p}_masked")], f"{p}_probs", axis=-1)
        return g.op("MatMul", [self.to_compute(probs, f"{p}_probs"), values], f"{p}_attn")

    def head(self, weights: LlamaWeights, x: str) -> None:
        """The logits of the wanted rows only: gathered *before* the final norm and the lm_head."""
        g, cfg = self.g, self.cfg
        g.init(weights.output_norm, "output_norm")
        hidden_rows = g.op("Reshape", [x, g.i64([-1, cfg.hidden], "shape_rows")], "hidden_rows")
        rows = g.op("Gather", [hidden_rows, "logit_index"], "logit_hidden", axis=0)
        hn = self.rms_norm(rows, "output_norm", "final_norm")
        logits, out = "logits", None
        if self.ct != TensorProto.FLOAT:
            logits, out = "logits_c", "logits"  # the lm_head in C, the logits cast to float32
        if self.weight_dtype in NBITS_WEIGHTS:
            head = output_bits(weights, self.weight_dtype)
            if head is None:  # tied: the embedding's Q8_0 blocks
                n, k = cfg.vocab, cfg.hidden
                g.named("MatMulNBits", [hn, "tok_embd.q8", "tok_embd.scale"], logits, domain=MS_DOMAIN, K=k, N=n, bits=8,
                        block_size=BLOCK, accuracy_level=NBITS_ACCURACY)
            else:
                g.named("Identity", [self.nbits(hn, "lm_head", head)], logits)
        elif self.weight_dtype == "int8":
            g.named("MatMul", [hn, self.matrix("lm_head", weights.output_matrix())], logits)
        elif weights.lm_head is None:
            g.named("Gemm", [hn, "tok_embd"], logits, transB=1)
        else:
            g.named("Gemm", [hn, self.weight(weights.lm_head, "lm_head")], logits, transB=1)
        if out is not None:
            g.named("Cast", [logits], out, to=TensorProto.FLOAT)

    def new_kv_output(self, new_kv: list[str]) -> None:
        """new_kv: [B, T, 2 * layers * nkv, hd] -> [B, T, layers, 2, nkv, hd] -> [layers, 2, B, T, nkv, hd]."""
        g, cfg = self.g, self.cfg
        stacked = g.op("Concat", new_kv, "kv_cat", axis=2)
        kv_shape = g.op("Concat", [self.ids_shape, g.i64([cfg.n_layers, 2, cfg.n_kv_heads, cfg.head_dim], "kv_tail")], "kv_shape", axis=0)
        g.named("Transpose", [g.op("Reshape", [stacked, kv_shape], "kv6")], "new_kv", perm=[2, 3, 0, 1, 4, 5])


_FIELD_BIAS = {m: b for b, m in BIAS_OF.items()}


def _bias(layer: LlamaLayerWeights, fields: tuple[str, ...]) -> np.ndarray | None:
    """The biases of the matrices ``fields`` stacked as they are (zeros for a matrix without one);
    None when none of them has one."""
    found = [getattr(layer, _FIELD_BIAS[f]) for f in fields]
    if all(b is None for b in found):
        return None
    return np.concatenate([b if b is not None else np.zeros(getattr(layer, f).shape[0], np.float32) for b, f in zip(found, fields)])


def _io(cfg: LlamaConfig, max_lanes, max_context, cache_inputs, precision) -> tuple[list, list]:
    nkv, hd, ct = cfg.n_kv_heads, cfg.head_dim, COMPUTE_TYPES[precision]
    S = max_context + 1 if max_context is not None else "cache_len"
    lanes = "batch" if cache_inputs == "pass" else (max_lanes if max_lanes is not None else "max_lanes")
    per_pass = {"input_ids": ["batch", "rows_per_lane"], "positions": ["batch", "rows_per_lane"], "lane_ids": ["batch"], "logit_index": ["logit_rows"]}
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, per_pass[name])
        for name in INPUTS
        if cache_inputs == "slots" or name != "lane_ids"
    ]
    for i in range(cfg.n_layers):
        inputs += [helper.make_tensor_value_info(name, ct, [lanes, nkv, S, hd]) for name in cache_names(i)]
    logits, new_kv = OUTPUTS
    outputs = [
        helper.make_tensor_value_info(logits, TensorProto.FLOAT, ["logit_rows", cfg.vocab]),
        helper.make_tensor_value_info(new_kv, ct, [cfg.n_layers, 2, "batch", "rows_per_lane", nkv, hd]),
    ]
    return inputs, outputs


def pass_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """The ``"pass"`` form of a ``"slots"`` decoder graph: no ``lane_ids``, the caches of the
    pass's lanes as inputs, read whole: their length ``E`` (the ``cache_len`` dim, symbolic) is
    the pass's key extent, which the runtime chooses (module docstring, *Key extent*), and the
    key index is ``0 .. E - 1`` from the bound cache's shape. Where the slots form gathers its
    lanes the pass form reads the input itself, so each layer copies its lanes' caches once
    (ScatterND's output), not twice. One more output
    (:data:`~sf_trt.formats.model_dir.PASS_OUTPUTS`): each logit row's greedy token, so a greedy
    step needs no second run. (Not its largest value: onnxruntime's ``ReduceMax`` passes over a
    NaN, which the row check must see.)

    Works on the graph alone (initializers are shared, never copied), so it can
    be applied to a graph loaded without its external data.
    """
    graph = model.graph
    if "lane_ids" not in {i.name for i in graph.input}:
        raise ValueError("pass_form: the graph has no lane_ids input (already the pass form?)")
    caches = {i.name for i in graph.input if i.name.startswith(("past_key_", "past_value_"))}
    # each gather of a cache's lanes -> the cache input itself
    renamed = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in caches}
    out = onnx.ModelProto()
    out.ir_version, out.producer_name = model.ir_version, model.producer_name
    out.opset_import.extend(model.opset_import)
    g = out.graph
    g.name = graph.name
    nodes = _key_index_nodes(min(caches))
    for node in graph.node:
        if node.output[0] == KEY_INDEX or node.output[0] in renamed:
            continue
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.input[:] = [renamed.get(name, name) for name in node.input]
        nodes.append(new)
    g.node.extend(_live(nodes, [o.name for o in graph.output]))
    used = {name for node in g.node for name in node.input}
    g.initializer.extend(t for t in graph.initializer if t.name in used and t.name != KEY_INDEX)
    for vi in graph.input:
        if vi.name == "lane_ids":
            continue
        new = g.input.add()
        new.CopyFrom(vi)
        if vi.name in caches:  # [batch, nkv, cache_len, hd]: the pass's lanes, at the pass's extent
            dims = new.type.tensor_type.shape.dim
            for axis, name in ((0, "batch"), (2, "cache_len")):
                dims[axis].Clear()
                dims[axis].dim_param = name
    g.output.extend(graph.output)
    (greedy,) = PASS_OUTPUTS  # what a greedy sampler computes, in the same run
    g.node.append(helper.make_node("ArgMax", [OUTPUTS[0]], [greedy], name=greedy, axis=1, keepdims=0, select_last_index=0))
    g.output.append(helper.make_tensor_value_info(greedy, TensorProto.INT64, ["logit_rows"]))
    out.metadata_props.extend(model.metadata_props)
    return out


def _key_index_nodes(cache: str) -> list[onnx.NodeProto]:
    """``key_idx = 0 .. E - 1``, ``E`` the length (axis 2) of the cache input ``cache``."""
    make = helper.make_node
    return [
        _const("pass_zero", 0), _const("pass_one", 1), _const("pass_two", 2),
        make("Shape", [cache], ["pass_cache_shape"], name="pass_cache_shape"),
        make("Gather", ["pass_cache_shape", "pass_two"], ["key_extent"], name="key_extent", axis=0),  # E
        make("Range", ["pass_zero", "key_extent", "pass_one"], [KEY_INDEX], name=KEY_INDEX),
    ]

"""The decoder's attention as onnxruntime's CPU backend runs it: every row summed in the same chunks in any pass, at any thread count.

A decoder layer's attention as :meth:`sf_trt.export.decoder_graph._Decoder.attend` writes it is
``MatMul(q, Transpose(K)) -> Add(mask) -> Softmax -> MatMul(V)``, batched over ``[lanes,
kv heads]``, with a ``Cast`` after each matmul below fp32. onnxruntime runs those matmuls through
MLAS's SGEMM, which sums each dot product over ``K`` in chunks whose length follows the number
of columns one thread computes (256 terms for 64 columns, 512 for 32, 1024 for 16, 128 for 128
or more), and which splits a GEMM among threads by its columns when the GEMM has fewer rows
than columns and the threads outnumber the GEMMs of the batch. A decode pass has a few rows per
kv head, a prefill or verify pass many; so with more threads than a pass's ``lanes *
n_kv_heads`` the same row's keys were summed in other chunks depending on the pass, and a
``QK^T`` of a head wider than 128 dims changed its chunks with the key extent at any thread
count: rows differing in their last bits (tests/backends/test_row_independence.py).

:func:`exact_attention` rewrites each attention (the graph alone; initializers shared):

* float32 heads of at most 128 dims: ONNX ``Attention`` (opset 23), each kv head's query rows
  given to it as one head of ``rep * grp * T`` rows (``q_num_heads == kv_num_heads``), the
  grouped mask and scale 1 (``cfg.scale`` is in the queries). onnxruntime's CPU kernel runs one
  single-threaded GEMM per lane and head (threads take whole heads), so no GEMM is ever split:
  the GEMMs of the batched matmuls, each on one thread, whatever the threads. It also adds the
  mask inside the ``QK^T`` GEMM and runs a head's softmax while its scores are fresh: 1.3x
  faster on a 4k-key prefill, level on decode (docs/benchmarks.md);
* otherwise (below fp32, or wider heads): the matmuls, ``QK^T`` summed in parts of
  :data:`QK_TERMS` dims added in order, and ``PV`` in blocks of :func:`pv_columns` value columns
  (a GEMM of at most 16 columns is never split by its columns).

The rewritten graph is opset :data:`ATTENTION_OPSET` (``ReduceMean`` takes its axes as an input).
"""

from __future__ import annotations

import onnx
from onnx import helper

from .ort_fusions import constant_node

__all__ = ["exact_attention", "ATTENTION_OPSET", "QK_TERMS", "PV_COLUMNS", "pv_columns"]

ATTENTION_OPSET = 23
"""ONNX ``Attention``'s opset (onnxruntime's CPU kernel since 1.23)."""
QK_TERMS = 128
"""The most terms of one ``QK^T`` dot product per matmul where the matmuls stay (MLAS's shortest
key chunk): a wider head is summed in parts of this many dims, added in order."""
PV_COLUMNS = 16
"""The most value columns one ``PV`` GEMM computes where the matmuls stay (MLAS's thread
alignment: a GEMM this narrow is never split among threads by its columns)."""


def pv_columns(head_dim: int) -> int:
    """The width of the value-column blocks: the largest divisor of ``head_dim`` up to :data:`PV_COLUMNS`."""
    return max(c for c in range(1, PV_COLUMNS + 1) if head_dim % c == 0)


def exact_attention(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the decoder ``model`` (either form) with each attention rewritten (module
    docstring), at opset :data:`ATTENTION_OPSET`."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    nodes = _rewritten(list(graph.node), {t.name: t for t in graph.initializer})
    del graph.node[:]
    graph.node.extend(_lifted(out, nodes))
    return out


def _rewritten(nodes: list[onnx.NodeProto], initializers: dict[str, onnx.TensorProto]) -> list[onnx.NodeProto]:
    producer = {o: n for n in nodes for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for name in n.input:
            consumers.setdefault(name, []).append(n)

    def only_consumer(name: str) -> onnx.NodeProto:
        return consumers[name][0]

    replace: dict[str, list[onnx.NodeProto]] = {}  # a node's name -> the nodes that compute its output instead
    drop: set[str] = set()
    shared: dict[str, onnx.NodeProto] = {}
    for softmax in (n for n in nodes if n.op_type == "Softmax"):
        add = producer[softmax.input[0]]
        cast_f32 = producer[add.input[0]] if producer[add.input[0]].op_type == "Cast" else None
        qk = producer[cast_f32.input[0]] if cast_f32 else producer[add.input[0]]
        cast_c = only_consumer(softmax.output[0]) if only_consumer(softmax.output[0]).op_type == "Cast" else None
        pv = only_consumer((cast_c or softmax).output[0])
        k_t = producer[qk.input[1]]
        if (add.op_type, qk.op_type, pv.op_type, k_t.op_type) != ("Add", "MatMul", "MatMul", "Transpose"):
            raise ValueError(f"exact_attention: the attention at {softmax.name!r} is not MatMul(q, Transpose(K)) -> Add(mask) -> Softmax -> MatMul(V)")
        n_kv, head_dim = _grouped_dims(initializers, producer, qk.input[0])
        if cast_f32 is None and cast_c is None and head_dim <= QK_TERMS:
            drop.update(n.name for n in (k_t, qk, add, softmax))
            replace[pv.name] = _fused(qk.input[0], k_t.input[0], pv.input[1], add.input[1], pv, n_kv, head_dim, shared)
        else:
            replace.update(_chunked(qk, pv, head_dim, shared))
    out: list[onnx.NodeProto] = []
    emitted: set[str] = set()
    for n in nodes:
        if n.name in replace:  # what the layers share, before its first use (a sliding layer's mask first used later)
            out += [node for name, node in shared.items() if name not in emitted]
            emitted.update(shared)
            out += replace[n.name]
        elif n.name not in drop:
            out.append(n)
    return out


def _fused(queries: str, keys: str, values: str, mask: str, pv: onnx.NodeProto, n_kv: int, head_dim: int, shared: dict) -> list[onnx.NodeProto]:
    """ONNX ``Attention`` computing ``pv``'s output ``[B, nkv, R, hd]`` (``R = rep * grp * T`` query
    rows per kv head) from the grouped ``queries``, the caches and the grouped ``mask``.

    Each kv head's rows go in as ``c`` heads of ``R / c`` rows, ``c = R / T`` (one query head
    each) when the pass has several rows a lane and ``c = 1`` when it has one: one GEMM per lane
    and query head (threads share a prefill's heads evenly), or per lane and kv head with at least
    two rows (MLAS multiplies a one-row matrix on another path). A GEMM's rows do not change
    each other's sums, so a row comes out the same either way. The mask goes in as its first
    ``R / c`` rows, for every head alike: a grouped mask's row depends on its query's position
    alone, and every head's ``R / c`` rows are the same positions."""
    make = helper.make_node
    for node in (
        constant_node("attn_one", [1]), constant_node("attn_zero", [0]), constant_node("attn_minus_one", [-1]),
        constant_node("attn_n_kv", [n_kv]), constant_node("attn_head_dim", [head_dim]), constant_node("attn_out_shape", [0, n_kv, -1, head_dim]),
        make("Shape", ["input_ids"], ["attn_t"], name="attn_t", start=1, end=2),  # T
        make("Shape", [queries], ["attn_r"], name="attn_r", start=2, end=3),  # R (every layer's)
        make("Div", ["attn_r", "attn_t"], ["attn_r_over_t"], name="attn_r_over_t"),
        make("Greater", ["attn_t", "attn_one"], ["attn_several"], name="attn_several"),
        make("Where", ["attn_several", "attn_r_over_t", "attn_one"], ["attn_heads_per_kv"], name="attn_heads_per_kv"),  # c
        make("Mul", ["attn_n_kv", "attn_heads_per_kv"], ["attn_q_heads"], name="attn_q_heads"),
        make("Concat", ["attn_zero", "attn_q_heads", "attn_minus_one", "attn_head_dim"], ["attn_q_shape"], name="attn_q_shape", axis=0),
        make("Div", ["attn_r", "attn_heads_per_kv"], ["attn_head_rows"], name="attn_head_rows"),  # R / c
        constant_node("attn_axis2", [2]),
        make("Slice", [mask, "attn_zero", "attn_head_rows", "attn_axis2"], [f"attn_{mask}_heads"], name=f"attn_{mask}_heads"),  # [B, 1, R / c, E]
    ):
        shared.setdefault(node.output[0], node)
    st = pv.name
    return [
        make("Reshape", [queries, "attn_q_shape"], [f"{st}_q"], name=f"{st}_q"),  # [B, nkv * c, R / c, hd]
        make("Attention", [f"{st}_q", keys, values, f"attn_{mask}_heads"], [f"{st}_heads"], name=f"{st}_heads", scale=1.0),
        make("Reshape", [f"{st}_heads", "attn_out_shape"], [pv.output[0]], name=pv.output[0]),  # [B, nkv, R, hd]
    ]


def _chunked(qk: onnx.NodeProto, pv: onnx.NodeProto, head_dim: int, shared: dict) -> dict[str, list[onnx.NodeProto]]:
    """The nodes that replace ``qk`` (in parts of :data:`QK_TERMS` dims, added in order, when the
    head is wider) and ``pv`` (in blocks of :func:`pv_columns` value columns)."""
    make = helper.make_node
    cols = pv_columns(head_dim)
    for name, value in (("attn_axis2", [2]), ("attn_axis_m1", [-1]), ("attn_axis_m2", [-2]),
                        ("attn_v_blocks", [0, 0, -1, head_dim // cols, cols]), ("attn_head_rows", [0, 0, -1, head_dim])):
        shared.setdefault(name, constant_node(name, value))
    replace = {}
    if head_dim > QK_TERMS:
        q, k_t = qk.input  # [B, nkv, R, hd], [B, nkv, hd, S]
        st, parts = qk.name, []
        for j, lo in enumerate(range(0, head_dim, QK_TERMS)):
            hi = min(lo + QK_TERMS, head_dim)
            span = [f"{st}_d{j}_lo", f"{st}_d{j}_hi"]
            parts += [constant_node(span[0], [lo]), constant_node(span[1], [hi])]
            parts.append(make("Slice", [q, *span, "attn_axis_m1"], [f"{st}_q{j}"], name=f"{st}_q{j}"))
            parts.append(make("Slice", [k_t, *span, "attn_axis_m2"], [f"{st}_k{j}"], name=f"{st}_k{j}"))
            parts.append(make("MatMul", [f"{st}_q{j}", f"{st}_k{j}"], [f"{st}_p{j}"], name=f"{st}_p{j}"))
            if j:  # the parts added in order of their dims
                out = qk.output[0] if hi == head_dim else f"{st}_s{j}"
                prev = f"{st}_p0" if j == 1 else f"{st}_s{j - 1}"
                parts.append(make("Add", [prev, f"{st}_p{j}"], [out], name=out))
        replace[qk.name] = parts
    probs, values = pv.input  # [B, nkv, R, S], [B, nkv, S, hd]
    st = pv.name
    replace[pv.name] = [
        make("Unsqueeze", [probs, "attn_axis2"], [f"{st}_probs5"], name=f"{st}_probs5"),  # [B, nkv, 1, R, S]
        make("Reshape", [values, "attn_v_blocks"], [f"{st}_v5"], name=f"{st}_v5"),  # [B, nkv, S, hd/cols, cols]
        make("Transpose", [f"{st}_v5"], [f"{st}_v_blocks"], name=f"{st}_v_blocks", perm=[0, 1, 3, 2, 4]),  # [B, nkv, hd/cols, S, cols]
        make("MatMul", [f"{st}_probs5", f"{st}_v_blocks"], [f"{st}_blocks"], name=f"{st}_blocks"),  # [B, nkv, hd/cols, R, cols]
        make("Transpose", [f"{st}_blocks"], [f"{st}_rows"], name=f"{st}_rows", perm=[0, 1, 3, 2, 4]),  # [B, nkv, R, hd/cols, cols]
        make("Reshape", [f"{st}_rows", "attn_head_rows"], [pv.output[0]], name=pv.output[0]),  # [B, nkv, R, hd]
    ]
    return replace


def _grouped_dims(initializers: dict[str, onnx.TensorProto], producer: dict[str, onnx.NodeProto], queries: str) -> tuple[int, int]:
    """``(n_kv_heads, head_dim)`` of the grouped queries ``queries`` ``[B, nkv, R, hd]``: from the
    Reshape that made them (through the Tile of ``rep``), its shape an initializer."""
    node = producer.get(queries)
    while node is not None and node.op_type == "Tile":
        node = producer.get(node.input[0])
    if node is not None and node.op_type == "Reshape" and node.input[1] in initializers:
        shape = onnx.numpy_helper.to_array(initializers[node.input[1]])
        return int(shape[1]), int(shape[-1])
    raise ValueError(f"exact_attention: cannot tell the kv heads and head size of {queries!r} (expected the grouped queries' Reshape)")


def _lifted(model: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """Lift ``model``'s default domain to :data:`ATTENTION_OPSET`; ``nodes`` as that opset takes
    them: ``ReduceMean``'s axes an input since opset 18 (the only op of the decoder whose form
    changed up to 23)."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = max(opset.version, ATTENTION_OPSET)
    lifted = []
    for node in nodes:
        axes = next((a for a in node.attribute if a.name == "axes"), None) if node.op_type == "ReduceMean" else None
        if axes is not None:
            lifted.append(constant_node(f"{node.name}_axes", list(axes.ints)))
            node.attribute.remove(axes)
            node.input.append(f"{node.name}_axes")
        lifted.append(node)
    return lifted

"""onnxruntime's fused ops in the decoder graph it runs: fewer, larger kernels per layer, rows still exact.

A decoder layer as :mod:`sf_trt.export.decoder_graph` writes it is standard ONNX (what TensorRT
builds). onnxruntime fuses some of it at load on its own (``DequantizeLinear -> MatMul`` into
``MatMulNBits``, the RMSNorm into ``SimplifiedLayerNormalization``, ``x * Sigmoid(x)`` into
``QuickGelu``) but not the rest, and at 135M a one-row pass is mostly per-node cost.
:func:`onnxruntime_fused` rewrites, in the graph alone (initializers are shared, never read or
copied):

* each layer's rotation, ``Split(q|k, v) -> Reshape -> x * cos + swap_pairs(x) * sin ->
  Split(q, k)``, into ``Split(q, k, v)`` and one contrib ``RotaryEmbedding`` (interleaved pairs,
  the GGUF's layout) for q and one for k, their ``[S, head_dim / 2]`` tables every other column of
  the builder's interleaved ones (q's times the attention scale, the product the rotation took
  before; onnxruntime folds them at load);
* each residual ``Add`` whose sum is RMSNorm'd next (``Pow -> ReduceMean -> Add(eps) -> Sqrt ->
  Div -> Mul(weight)``) into one ``SkipSimplifiedLayerNormalization``, which gives the sum too.

What does not match the builder's pattern is left as it is (the per-head q/k norms of Qwen 3 and
Gemma 3 before the rotation; an fp16 or bf16 graph's rotation). Each fused kernel computes a row
from that row alone, over the model's fixed dims, so a row's bits still do not depend on how a pass
is packed (tests/graphs/test_ort_fusions.py, tests/backends/test_row_independence.py); they differ
from the unfused graph's in the last bits (fused multiply-adds, another summation order).

The model directory's graphs stay standard ONNX (``decoder.onnx`` is what TensorRT builds, and
onnxruntime's CUDA and TensorRT providers run ``decoder_pass.onnx`` as written): onnxruntime's CPU
backend fuses whichever form it opens as it loads it
(:func:`sf_trt.backends.ort_decoder.loaded_graph`), so both of its forms give a row the same bits.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = ["onnxruntime_fused", "live_nodes", "constant_node", "MS_DOMAIN", "FUSED_OPS"]

MS_DOMAIN = "com.microsoft"
"""onnxruntime's contrib domain."""
FUSED_OPS = ("RotaryEmbedding", "SkipSimplifiedLayerNormalization")
"""The contrib ops :func:`onnxruntime_fused` writes."""


def onnxruntime_fused(model: onnx.ModelProto, *, rotary: bool = True, skip_norm: bool = True) -> onnx.ModelProto:
    """A copy of the decoder ``model`` (either form) in onnxruntime's fused ops (module docstring):
    the rotations (``rotary``) and the residual adds with their norms (``skip_norm``)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {t.name: t for t in graph.initializer}
    index = _NodeIndex(list(graph.node))
    if rotary:
        _fuse_rotary(index, inits)
    if skip_norm:
        _fuse_skip_norm(index, inits)
    nodes = live_nodes(index.nodes(), [o.name for o in graph.output])
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if any(n.domain == MS_DOMAIN for n in nodes) and MS_DOMAIN not in {o.domain for o in out.opset_import}:
        out.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return out


def live_nodes(nodes: list[onnx.NodeProto], outputs: list[str]) -> list[onnx.NodeProto]:
    """``nodes`` (in order) less those no graph output depends on."""
    needed, live = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            live.append(node)
            needed.update(node.input)
    return live[::-1]


class _NodeIndex:
    """Nodes by the tensors they make and read, edited in place (removed nodes are dropped, new
    ones go where the node they replace was)."""

    def __init__(self, nodes: list[onnx.NodeProto]) -> None:
        self.order = list(nodes)
        self.producer = {o: n for n in nodes for o in n.output}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in nodes:
            for name in n.input:
                self.readers.setdefault(name, []).append(n)
        self.dropped: set[int] = set()
        self.inserted: dict[int, list[onnx.NodeProto]] = {}

    def made_by(self, name: str, op_type: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") and id(node) not in self.dropped else None

    def only_reader(self, name: str, op_type: str) -> onnx.NodeProto | None:
        found = self.readers.get(name, [])
        return found[0] if len(found) == 1 and found[0].op_type == op_type and id(found[0]) not in self.dropped else None

    def replace(self, old: list[onnx.NodeProto], new: list[onnx.NodeProto]) -> None:
        """Drop ``old`` and put ``new`` where the first of ``old`` (in graph order) was."""
        where = {id(n): i for i, n in enumerate(self.order)}
        first = min(old, key=lambda n: where[id(n)])
        self.inserted.setdefault(id(first), []).extend(new)
        self.dropped.update(id(n) for n in old)

    def prepend(self, new: list[onnx.NodeProto]) -> None:
        """Put ``new`` before every node (they read only initializers and graph inputs)."""
        if new:
            self.inserted.setdefault(id(self.order[0]), [])[:0] = new

    def nodes(self) -> list[onnx.NodeProto]:
        out = []
        for n in self.order:
            out += self.inserted.get(id(n), [])
            if id(n) not in self.dropped:
                out.append(n)
        return out


def _scalar(inits: dict[str, onnx.TensorProto], name: str) -> np.ndarray | None:
    """The value of the initializer ``name`` when the graph holds it inline (small), else None."""
    t = inits.get(name)
    if t is None or t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    return onnx.numpy_helper.to_array(t)


def constant_node(name: str, value) -> onnx.NodeProto:
    """A ``Constant`` node of ``value`` (an array, or a list of int64), its output ``name``."""
    array = value if isinstance(value, np.ndarray) else np.asarray(value, np.int64)
    return helper.make_node("Constant", [], [name], name=name, value=onnx.numpy_helper.from_array(array, name))


def _fuse_rotary(graph: _NodeIndex, inits: dict[str, onnx.TensorProto]) -> None:
    """Each layer's ``Split(q|k, v) -> Reshape -> x * cos + swap_pairs(x) * sin -> Split(q, k)`` as
    ``Split(q, k, v)`` and one ``RotaryEmbedding`` (interleaved pairs) for q, one for k, their
    tables the builder's (every other column of the interleaved ``[S, head_dim]`` tables, q's
    times ``head_scale``'s q rows: the products the rotation multiplied by before)."""
    split_q_k, shape_qk, head_scale = (_scalar(inits, n) for n in ("split_q_k", "shape_qk", "head_scale"))
    if split_q_k is None or shape_qk is None or head_scale is None or inits["head_scale"].data_type != TensorProto.FLOAT:
        return  # not the builder's float32 graph: left as it is
    nh, nkv = (int(v) for v in split_q_k)
    hd = int(shape_qk[3])
    q_scale, k_scale = np.unique(head_scale[:nh]), np.unique(head_scale[nh:])
    if len(q_scale) != 1 or k_scale.tolist() != [1.0]:
        return
    first = [constant_node("rot_split", np.array([nh * hd, nkv * hd, nkv * hd], np.int64)),
             constant_node("rot_shape_q", np.array([0, 0, nh, hd], np.int64))]
    tables: dict[tuple[str, str], tuple[str, ...]] = {}
    for add in [n for n in graph.order if n.op_type == "Add"]:
        found = _rotation(graph, add)
        key = found and _table_names(graph, found[3], found[4])
        if not key:
            continue
        split_qkv, old, q_k = found[:3]
        if key not in tables:
            tables[key] = _rotary_tables(first, key, hd, float(q_scale[0]), len(tables))
        cos_q, sin_q, cos_k, sin_k = tables[key]
        stem = q_k.output[0]
        q3, k3 = f"{stem}_q3", f"{stem}_k3"
        graph.replace(old, [
            helper.make_node("Split", [split_qkv.input[0], "rot_split"], [q3, k3, split_qkv.output[1]], name=f"{stem}_split3", axis=-1),
            helper.make_node("RotaryEmbedding", [q3, "positions", cos_q, sin_q], [f"{q3}_rot"], name=f"{q3}_rot", domain=MS_DOMAIN,
                             interleaved=1, num_heads=nh),
            helper.make_node("Reshape", [f"{q3}_rot", "rot_shape_q"], [q_k.output[0]], name=q_k.output[0]),
            helper.make_node("RotaryEmbedding", [k3, "positions", cos_k, sin_k], [f"{k3}_rot"], name=f"{k3}_rot", domain=MS_DOMAIN,
                             interleaved=1, num_heads=nkv),
            helper.make_node("Reshape", [f"{k3}_rot", "shape_kv"], [q_k.output[1]], name=q_k.output[1]),
        ])
    if tables:
        graph.prepend(first)


def _rotation(graph: _NodeIndex, add: onnx.NodeProto):
    """The nodes of one layer's rotation ending at ``add`` as the builder writes them, or None."""
    mul_c, mul_s = graph.made_by(add.input[0], "Mul"), graph.made_by(add.input[1], "Mul")
    if mul_c is None or mul_s is None:
        return None
    x, cos_rows = mul_c.input
    swap, sin_rows = mul_s.input
    gather, reshape = graph.made_by(swap, "Gather"), graph.made_by(x, "Reshape")
    if gather is None or list(gather.input) != [x, "pair_swap"] or reshape is None or reshape.input[1] != "shape_qk":
        return None
    split_qkv = graph.made_by(reshape.input[0], "Split")
    q_k = graph.only_reader(add.output[0], "Split")
    if split_qkv is None or split_qkv.input[1] != "split_qk_v" or q_k is None or q_k.input[1] != "split_q_k":
        return None
    if len(graph.readers[reshape.input[0]]) != 1 or len(graph.readers[x]) != 2:
        return None
    return split_qkv, [split_qkv, reshape, gather, mul_c, mul_s, add, q_k], q_k, cos_rows, sin_rows


def _table_names(graph: _NodeIndex, cos_rows: str, sin_rows: str) -> tuple[str, str] | None:
    """The ``[S, head_dim]`` tables the pass's rotary rows ``cos_rows``, ``sin_rows`` are gathered from
    (``Mul(Unsqueeze(Gather(table, positions)), head_scale)``), or None."""
    names = []
    for rows in (cos_rows, sin_rows):
        mul = graph.made_by(rows, "Mul")
        unsq = mul and graph.made_by(mul.input[0], "Unsqueeze")
        gather = unsq and graph.made_by(unsq.input[0], "Gather")
        if not gather or mul.input[1] != "head_scale" or gather.input[1] != "positions":
            return None
        names.append(gather.input[0])
    return names[0], names[1]


def _rotary_tables(nodes: list[onnx.NodeProto], tables: tuple[str, str], hd: int, q_scale: float, n: int) -> tuple[str, ...]:
    """Appends to ``nodes`` the ``[S, head_dim / 2]`` cos and sin tables ``RotaryEmbedding`` takes,
    from the interleaved tables ``tables`` (cos in both columns of a pair, sin signed ``-, +``):
    q's (times ``q_scale``) and k's; their names. Constants of the graph's initializers, which
    onnxruntime folds at load."""
    cos, sin = tables
    p = f"rot{n}"
    nodes += [
        constant_node(f"{p}_starts_c", np.array([0], np.int64)), constant_node(f"{p}_starts_s", np.array([1], np.int64)),
        constant_node(f"{p}_ends", np.array([hd], np.int64)), constant_node(f"{p}_axes", np.array([1], np.int64)),
        constant_node(f"{p}_steps", np.array([2], np.int64)), constant_node(f"{p}_q_scale", np.array(q_scale, np.float32)),
        helper.make_node("Slice", [cos, f"{p}_starts_c", f"{p}_ends", f"{p}_axes", f"{p}_steps"], [f"{p}_cos_k"], name=f"{p}_cos_k"),
        helper.make_node("Slice", [sin, f"{p}_starts_s", f"{p}_ends", f"{p}_axes", f"{p}_steps"], [f"{p}_sin_k"], name=f"{p}_sin_k"),
        helper.make_node("Mul", [f"{p}_cos_k", f"{p}_q_scale"], [f"{p}_cos_q"], name=f"{p}_cos_q"),
        helper.make_node("Mul", [f"{p}_sin_k", f"{p}_q_scale"], [f"{p}_sin_q"], name=f"{p}_sin_q"),
    ]
    return f"{p}_cos_q", f"{p}_sin_q", f"{p}_cos_k", f"{p}_sin_k"


def _fuse_skip_norm(graph: _NodeIndex, inits: dict[str, onnx.TensorProto]) -> None:
    """Each residual ``Add`` whose sum is then RMSNorm'd (``Pow -> ReduceMean -> Add(eps) -> Sqrt ->
    Div -> Mul(weight)``) as one ``SkipSimplifiedLayerNormalization``, which gives both."""
    eps = _scalar(inits, "rms_eps")
    if eps is None or eps.size != 1:
        return
    for pow_ in [n for n in graph.order if n.op_type == "Pow" and n.input[1] == "two"]:
        total = pow_.input[0]
        add = graph.made_by(total, "Add")
        if add is None or any(name in inits for name in add.input):
            continue
        mean = graph.only_reader(pow_.output[0], "ReduceMean")
        with_eps = mean and graph.only_reader(mean.output[0], "Add")
        sqrt = with_eps and with_eps.input[1] == "rms_eps" and graph.only_reader(with_eps.output[0], "Sqrt")
        div = sqrt and graph.only_reader(sqrt.output[0], "Div")
        mul = div and list(div.input) == [total, sqrt.output[0]] and graph.only_reader(div.output[0], "Mul")
        if not mul or mul.input[0] != div.output[0] or mul.input[1] not in inits:
            continue
        graph.replace([add, pow_, mean, with_eps, sqrt, div, mul], [helper.make_node(
            "SkipSimplifiedLayerNormalization", [add.input[1], add.input[0], mul.input[1]], [mul.output[0], "", "", total],
            name=f"{mul.output[0]}_skip", domain=MS_DOMAIN, epsilon=float(eps.reshape(-1)[0]),
        )])

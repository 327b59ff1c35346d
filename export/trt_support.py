"""What TensorRT's ONNX parser accepts, checked without TensorRT installed.

``check_graph(model)`` walks every node (subgraphs of ``If``/``Loop``/``Scan``
included, and the bodies of model-local functions) and returns a :class:`Finding`
for each thing the parser would refuse: an op it has no importer for, an input
dtype outside the op's supported types, an attribute value it rejects, an input
that must be a build-time constant but is computed at run time, an op outside
the default ONNX domain with no plugin declared, an opset outside the parser's
range; and integer arithmetic not proven exact: an integer ``Div``/``Mod`` whose
operands are not proven inside ``(-2**24, 2**24)`` from the ranges the graph
declares is an error, other integer arithmetic outside it a warning
(:mod:`sf_trt.export.int_bounds`; TensorRT's integer division may round through
float32). ``sf-trt build`` runs it before it hands a graph to TensorRT, and
``sf-trt build --check`` runs it alone.

Sources (cited per entry below as [M], [I], [D], [C]):

* [M] onnx-tensorrt ``docs/operators.md``, the support matrix shipped with
  TensorRT 10.x (read at the 10.15 revision: "supports operators in the
  inclusive range of opset 9 to opset 24"; the 10.0 revision says opset 9 to 20).
  Op list, per-op "Supported Types" and "Restrictions" come from there.
* [I] onnx-tensorrt ``onnxOpImporters.cpp`` (the importers behind the matrix),
  where an importer is stricter than the matrix says: ``Mod`` with ``fmod=0``
  refuses floating-point inputs; ``Range`` takes only FP32/INT32/INT64;
  ``MatMul`` refuses INT32/INT64.
* [D] TensorRT's ``DataType`` enum (FLOAT, HALF, BF16, INT8, INT32, INT64,
  BOOL, UINT8, FP8, INT4, FP4): a tensor of any other ONNX type cannot exist
  in a network; the matrix's notes say DOUBLE is cast down to FLOAT (a
  warning here), UINT8 is allowed only as a network input or output, and
  INT8/INT4/FP8/FP4 only through Q/DQ quantization.
* [C] Conservative choices of this module, stricter than the newest parser so
  that a graph passing here parses on every supported TensorRT (10.12 to 11.x; the
  floor sits above 10.0/10.1, whose parsers took less than this table says): opset
  <= 20 by default (the 10.0 range), TopK's K a build-time constant (the 3840 bound
  cannot be checked otherwise, and TensorRT 8.x-9.x required an initializer); no
  shape computed from an input's values (every engine takes one fixed shape);
  onnxruntime's contrib ops (a q4 export's ``MatMulNBits``) refused with what to
  export instead.

The table is data: a graph that uses an op missing from it is refused with
"not in the table", never waved through. Keep entries sourced when adding one.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import onnx
import onnx.shape_inference
from onnx import TensorProto, numpy_helper

from sf_trt.graphs.ort_fusions import FUSED_OPS, MS_DOMAIN
from sf_trt.graphs.ranges import RANGES_KEY
from sf_trt.graphs.verify import TOPK_MAX_K  # [M] "`K` input must be less than 3840"

from .int_bounds import arithmetic_findings
from .trt_config import DEFAULT_MAX_OPSET

__all__ = [
    "Finding",
    "OpRule",
    "OP_RULES",
    "UNSUPPORTED_OPS",
    "ONNXRUNTIME_ONLY",
    "SHAPE_INPUTS",
    "VALUE_SHAPED_OPS",
    "DEFAULT_MAX_OPSET",
    "MIN_OPSET",
    "TOPK_MAX_K",
    "check_graph",
    "check_file",
    "check_dir",
    "errors_in",
    "format_findings",
]

MIN_OPSET = 9
"""[M] lowest default-domain opset the parser imports."""

_DEFAULT_DOMAINS = ("", "ai.onnx")

# -- dtypes ------------------------------------------------------------------

# ONNX element type -> the short names the matrix uses.
_TYPE_NAME = {
    TensorProto.FLOAT: "FP32",
    TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.INT8: "INT8",
    TensorProto.UINT8: "UINT8",
    TensorProto.BOOL: "BOOL",
    TensorProto.DOUBLE: "DOUBLE",
    TensorProto.FLOAT8E4M3FN: "FP8",
    TensorProto.INT4: "INT4",
    TensorProto.FLOAT4E2M1: "FP4",
}


def _type_name(elem_type: int) -> str:
    return _TYPE_NAME.get(elem_type) or TensorProto.DataType.Name(elem_type)


FLOATS = frozenset({"FP32", "FP16", "BF16"})
INTS = frozenset({"INT32", "INT64"})
BOOL = frozenset({"BOOL"})
QUANT = frozenset({"INT8", "FP8", "INT4", "FP4"})
"""[D]/[M] quantized types: only produced by QuantizeLinear, consumed by DequantizeLinear."""
TRT_TYPES = FLOATS | INTS | BOOL | QUANT | {"UINT8"}
"""[D] every ONNX type with a TensorRT ``DataType``; DOUBLE is cast down (warning)."""

# -- the table ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing TensorRT's parser would refuse (``severity="error"``) or
    change silently (``"warning"``).

    ``graph`` is the path of the (sub)graph the node is in, ``node`` its name
    (or ``#index`` when unnamed, or the tensor for graph-level findings).
    """

    graph: str
    node: str
    op_type: str
    problem: str
    expected: str
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.graph}/{self.node}" if self.graph and self.graph != "main" else self.node
        op = f" ({self.op_type})" if self.op_type else ""
        return f"{self.severity}: {where}{op}: {self.problem}; expected {self.expected}"


@dataclasses.dataclass(frozen=True)
class OpRule:
    """What TensorRT's parser accepts for one op.

    ``types``: allowed dtypes of the inputs named in ``typed_inputs`` (or of
    the outputs in ``typed_outputs``, for ops whose type is their output's);
    ``const_inputs``: input index -> name, inputs that must be build-time
    constants (an initializer or a ``Constant`` node's output); ``check``: any
    further constraint, returning ``(problem, expected)`` pairs.
    """

    types: frozenset[str]
    typed_inputs: tuple[int, ...] = (0,)
    typed_outputs: tuple[int, ...] = ()
    const_inputs: Mapping[int, str] = dataclasses.field(default_factory=dict)
    check: Callable[["_NodeView"], list[tuple[str, str]]] | None = None
    source: str = "[M]"


def _rule(types: Iterable[str], **kw) -> OpRule:
    return OpRule(frozenset(types), **kw)


# Extra constraints, one function per op that has them.


def _check_topk(n: "_NodeView") -> list[tuple[str, str]]:
    out = []
    if n.attr("sorted", 1) != 1:  # [M] "`sorted` must be 1"
        out.append((f"sorted={n.attr('sorted', 1)}", "sorted=1 (TensorRT's TopK always returns sorted values)"))
    if n.opset < 10:
        k = n.attr("k", None)
        k_desc = "attribute k"
    else:
        k_desc = "input K"
        if len(n.inputs) < 2 or not n.inputs[1]:
            return out + [("no K input", "K as input 1 (opset >= 10)")]
        if not n.is_const(1):  # [C]
            return out + [
                (
                    f"{k_desc} ({n.inputs[1]!r}) is computed at run time",
                    f"K from an initializer or Constant, so the bound K < {TOPK_MAX_K} holds at build time",
                )
            ]
        value = n.const_value(1)
        k = None if value is None else int(np.asarray(value).reshape(-1)[0])
    if k is not None and not 0 < k < TOPK_MAX_K:  # [M]
        out.append((f"K={k}", f"0 < K < {TOPK_MAX_K}"))
    return out


def _check_mod(n: "_NodeView") -> list[tuple[str, str]]:
    # [I] importMod: fmod=0 (integer modulo, sign of the divisor) takes INT32/INT64 only.
    dtype = n.input_type(0)
    if n.attr("fmod", 0) == 0 and dtype is not None and dtype not in INTS:
        return [(f"fmod=0 on {dtype} inputs", "fmod=0 with INT32/INT64 inputs, or fmod=1 for floating point")]
    return []


def _check_range(n: "_NodeView") -> list[tuple[str, str]]:
    # [I] importRange: "only supports int32, int64, and float input types".
    dtype = n.input_type(0)
    if dtype is not None and dtype not in {"FP32", "INT32", "INT64"}:
        return [(f"start/limit/delta of type {dtype}", "FP32, INT32 or INT64")]
    return []


def _check_cast(n: "_NodeView") -> list[tuple[str, str]]:
    to = n.attr("to", None)
    if to is None:
        return []
    name = _type_name(int(to))
    if name == "DOUBLE":
        return []  # reported as a warning by the dtype pass
    allowed = OP_RULES["Cast"].types
    if name not in allowed:
        return [(f"to={name}", f"to one of {_fmt_types(allowed)}")]
    return []


def _check_constant(n: "_NodeView") -> list[tuple[str, str]]:
    # [M] "`sparse_value`, `value_string`, and `value_strings` attributes are unsupported."
    bad = [a for a in ("sparse_value", "value_string", "value_strings") if n.has_attr(a)]
    return [(f"attribute {a}", "value, value_float(s) or value_int(s)") for a in bad]


def _check_scatter_nd(n: "_NodeView") -> list[tuple[str, str]]:
    # [M] "`reduction` other than `none` is not supported"
    red = n.attr("reduction", "none")
    return [] if red == "none" else [(f"reduction={red!r}", "reduction='none'")]


def _check_dropout(n: "_NodeView") -> list[tuple[str, str]]:
    # [M] "`is_training` must be an initializer and evaluate to False."
    if len(n.inputs) < 3 or not n.inputs[2]:
        return []
    if not n.is_const(2):
        return [("is_training is computed at run time", "is_training an initializer equal to False")]
    value = n.const_value(2)
    if value is not None and bool(np.asarray(value).reshape(-1)[0]):
        return [("is_training=True", "is_training=False")]
    return []


def _check_only_first_output(what: str) -> Callable[["_NodeView"], list[tuple[str, str]]]:
    def check(n: "_NodeView") -> list[tuple[str, str]]:
        extra = [o for o in n.outputs[1:] if o]
        return [(f"uses outputs {extra}", f"only the first output ({what})")] if extra else []

    return check


def _check_maxpool(n: "_NodeView") -> list[tuple[str, str]]:
    out = _check_only_first_output("Y; the `Indices` output is unsupported")(n)
    return out + _check_dilations(n)


def _check_dilations(n: "_NodeView") -> list[tuple[str, str]]:
    dil = n.attr("dilations", None)
    if dil and any(int(d) != 1 for d in dil):
        return [(f"dilations={list(dil)}", "dilations empty or all ones")]
    return []


def _check_lstm(n: "_NodeView") -> list[tuple[str, str]]:
    out = []
    for a in ("input_forget", "layout"):  # [M]
        if n.attr(a, 0) != 0:
            out.append((f"{a}={n.attr(a, 0)}", f"{a}=0"))
    return out


def _check_resize(n: "_NodeView") -> list[tuple[str, str]]:
    # [M] Resize restrictions.
    allowed = {
        "coordinate_transformation_mode": (
            "half_pixel",
            {"half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "asymmetric", "align_corners"},
        ),
        "mode": ("nearest", {"nearest", "linear"}),
        "nearest_mode": ("round_prefer_floor", {"floor", "ceil", "round_prefer_floor", "round_prefer_ceil"}),
        "keep_aspect_ratio_policy": ("stretch", {"stretch"}),
    }
    out = []
    for attr, (default, ok) in allowed.items():
        value = n.attr(attr, default)
        if value not in ok:
            out.append((f"{attr}={value!r}", f"{attr} in {sorted(ok)}"))
    if n.attr("antialias", 0):
        out.append(("antialias=1", "antialias=0"))
    return out


def _check_attention(n: "_NodeView") -> list[tuple[str, str]]:
    # [M] Attention: past_key/past_value/nonpad_kv_seqlen inputs, present_* and
    # qk_matmul_output outputs, qk_matmul_output_mode and softcap unsupported.
    out = []
    for i, name in ((4, "past_key"), (5, "past_value"), (6, "nonpad_kv_seqlen")):
        if len(n.inputs) > i and n.inputs[i]:
            out.append((f"input {name}", f"no {name} input"))
    for i, name in ((1, "present_key"), (2, "present_value"), (3, "qk_matmul_output")):
        if len(n.outputs) > i and n.outputs[i]:
            out.append((f"output {name}", "only the first output"))
    for a in ("qk_matmul_output_mode", "softcap"):
        if n.has_attr(a):
            out.append((f"attribute {a}", f"no {a}"))
    return out


def _check_squeeze(n: "_NodeView") -> list[tuple[str, str]]:
    # [M] Squeeze without axes squeezes every 1-dim: the input shape must be static.
    has_axes = n.has_attr("axes") or (len(n.inputs) > 1 and bool(n.inputs[1]))
    if not has_axes and n.op_type == "Squeeze":
        shape = n.input_shape(0)
        if shape is None or any(not isinstance(d, int) for d in shape):
            return [("no axes and a dynamic input shape", "explicit axes")]
    return []


def _check_hardmax(n: "_NodeView") -> list[tuple[str, str]]:
    shape = n.input_shape(0)
    if shape is None:
        return []
    axis = n.attr("axis", -1)
    axis = axis + len(shape) if axis < 0 else axis
    if 0 <= axis < len(shape) and not isinstance(shape[axis], int):
        return [(f"dimension {axis} of the input is dynamic", "the axis dimension a build-time constant")]
    return []


def _check_eyelike(n: "_NodeView") -> list[tuple[str, str]]:
    shape = n.input_shape(0)
    if shape is not None and any(not isinstance(d, int) for d in shape):
        return [("dynamic input shape", "static input dimensions")]
    return []


def _check_tensor_scatter(n: "_NodeView") -> list[tuple[str, str]]:
    # [M]/[I] TensorScatter: 4-D past_cache and update, axis -2, mode linear.
    out = []
    for i, name in ((0, "past_cache"), (1, "update")):
        shape = n.input_shape(i)
        if shape is not None and len(shape) != 4:
            out.append((f"{name} of rank {len(shape)}", f"{name} 4-D"))
    axis = n.attr("axis", -2)
    if axis not in (-2, 2):
        out.append((f"axis={axis}", "axis=-2"))
    if n.attr("mode", "linear") != "linear":
        out.append((f"mode={n.attr('mode', 'linear')!r}", "mode='linear'"))
    return out


F, I, B = FLOATS, INTS, BOOL
FI = F | I
FIB = F | I | B

_REDUCE_AXES = {1: "axes"}  # [M] Reduce*: "`axes` must be an initializer" (input 1 from opset 18; ReduceSum from 13)

OP_RULES: dict[str, OpRule] = {
    # elementwise and math [M]
    "Abs": _rule(FI), "Add": _rule(FI), "Sub": _rule(FI), "Mul": _rule(FI), "Div": _rule(FI),
    "Neg": _rule(FI), "Sign": _rule(FI), "Max": _rule(FI), "Min": _rule(FI), "Sum": _rule(FI),
    "Mean": _rule(FI | {"FP8"}), "Relu": _rule(FI),
    "Pow": _rule(FI),
    "Mod": _rule(FI, check=_check_mod, source="[M][I]"),
    "Acos": _rule(F), "Acosh": _rule(F), "Asin": _rule(F), "Asinh": _rule(F), "Atan": _rule(F),
    "Atanh": _rule(F), "Cos": _rule(F), "Cosh": _rule(F), "Sin": _rule(F), "Sinh": _rule(F),
    "Tan": _rule(F), "Tanh": _rule(F), "Exp": _rule(F), "Log": _rule(F), "Sqrt": _rule(F),
    "Reciprocal": _rule(F), "Erf": _rule(F), "Ceil": _rule(F), "Floor": _rule(F), "Round": _rule(F),
    "Sigmoid": _rule(F), "HardSigmoid": _rule(F), "HardSwish": _rule(F), "Softplus": _rule(F),
    "Softsign": _rule(F), "Elu": _rule(F), "Selu": _rule(F), "Celu": _rule(F), "LeakyRelu": _rule(F),
    "ThresholdedRelu": _rule(F), "ScaledTanh": _rule(F), "ParametricSoftplus": _rule(F),
    "PRelu": _rule(F), "Mish": _rule({"FP32", "FP16"}), "Gelu": _rule(FI | {"INT8"}),
    "Clip": _rule(F), "Shrink": _rule(FI),
    "IsInf": _rule(F), "IsNaN": _rule(FI),
    # comparisons and logic [M]
    "Equal": _rule(FI), "Greater": _rule(FI), "GreaterOrEqual": _rule(FI), "Less": _rule(FI),
    "LessOrEqual": _rule(FI), "And": _rule(B), "Or": _rule(B), "Xor": _rule(B), "Not": _rule(B),
    "Where": _rule(FIB, typed_inputs=(1, 2)),
    # reductions and normalization [M]
    "ArgMax": _rule(FI), "ArgMin": _rule(FI),
    **{
        op: _rule(FI, const_inputs=_REDUCE_AXES)
        for op in (
            "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
            "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
        )
    },
    "Softmax": _rule(F), "LogSoftmax": _rule(F), "Hardmax": _rule(F, check=_check_hardmax),
    "CumSum": _rule(F, const_inputs={1: "axis"}),  # [M] FP32/FP16/BF16 only; "`axis` must be a build-time constant"
    "TopK": _rule(FI, check=_check_topk),
    "LayerNormalization": _rule(F, check=_check_only_first_output("Y")),
    "RMSNormalization": _rule(F), "GroupNormalization": _rule(F), "InstanceNormalization": _rule(F),
    "BatchNormalization": _rule(F), "LpNormalization": _rule(F), "MeanVarianceNormalization": _rule(F),
    "LRN": _rule(F),
    # linear algebra [M][I]
    "MatMul": _rule(F, source="[M][I]"), "Gemm": _rule(F), "Einsum": _rule(F),
    "Attention": _rule(F | {"INT8", "FP8"}, check=_check_attention),
    "RotaryEmbedding": _rule(F),
    # shape and data movement [M]
    "Cast": _rule(FI | {"UINT8", "BOOL"}, check=_check_cast),
    "CastLike": _rule(FI | {"UINT8", "BOOL"}),
    "Concat": _rule(FIB), "Constant": _rule(FIB | {"FP8", "FP4", "INT4"}, typed_inputs=(), typed_outputs=(0,), check=_check_constant),
    "ConstantOfShape": _rule(FIB | {"FP8", "FP4", "INT4"}, typed_inputs=(), typed_outputs=(0,)),
    "DepthToSpace": _rule(FI), "SpaceToDepth": _rule(FI),
    "Expand": _rule(FIB), "EyeLike": _rule(FIB, check=_check_eyelike), "Flatten": _rule(FIB),
    "Gather": _rule(FIB), "GatherElements": _rule(FIB), "GatherND": _rule(FIB),
    "Identity": _rule(FIB), "OneHot": _rule(FIB, typed_inputs=(2,), const_inputs={1: "depth"}),
    "Pad": _rule(FI), "Range": _rule(FI, check=_check_range, source="[M][I]"),
    "Reshape": _rule(FIB), "ReverseSequence": _rule(FIB),
    "Scatter": _rule(FI), "ScatterElements": _rule(FI), "ScatterND": _rule(FI, check=_check_scatter_nd),
    "TensorScatter": _rule(F | {"INT32"}, check=_check_tensor_scatter),
    "Shape": _rule(FIB), "Size": _rule(FIB), "Slice": _rule(FIB), "Split": _rule(FIB),
    "Squeeze": _rule(FIB, const_inputs={1: "axes"}, check=_check_squeeze),  # [M] "`axes` must be resolvable to a constant"
    "Unsqueeze": _rule(FIB, const_inputs={1: "axes"}),
    "Tile": _rule(FIB), "Transpose": _rule(FIB), "Trilu": _rule(FIB), "Upsample": _rule(F),
    "Resize": _rule(F, check=_check_resize),
    # control flow [M]: subgraphs are checked node by node as well
    "If": _rule(FIB, typed_inputs=()), "Loop": _rule(FIB, typed_inputs=()), "Scan": _rule(F, typed_inputs=()),
    # convolution and pooling [M]
    "Conv": _rule(F), "ConvTranspose": _rule(F), "DeformConv": _rule({"FP32", "FP16"}),
    "AveragePool": _rule(F, check=_check_dilations), "MaxPool": _rule(F, check=_check_maxpool),
    "LpPool": _rule(F, check=_check_dilations), "GlobalAveragePool": _rule(F), "GlobalLpPool": _rule(F),
    "GlobalMaxPool": _rule(F), "GridSample": _rule({"FP32", "FP16"}), "RoiAlign": _rule({"FP32", "FP16"}),
    "ImageScaler": _rule(F),
    # recurrent [M]
    "GRU": _rule(F), "LSTM": _rule(F, check=_check_lstm), "RNN": _rule(F),
    # random [M] (the parser ignores `seed`: never use these where draws must repeat)
    "RandomNormal": _rule(F, typed_inputs=(), typed_outputs=(0,)),
    "RandomUniform": _rule(F, typed_inputs=(), typed_outputs=(0,)),
    "RandomNormalLike": _rule(F), "RandomUniformLike": _rule(F),
    "Dropout": _rule(F, check=_check_dropout),
    # quantization [M]
    "QuantizeLinear": _rule(F), "DequantizeLinear": _rule(QUANT),
    # misc [M]
    "NonMaxSuppression": _rule({"FP32", "FP16"}), "NonZero": _rule({"FP32", "FP16"}),
    "BlackmanWindow": _rule({"FP32", "FP16"}, typed_inputs=()), "HammingWindow": _rule({"FP32", "FP16"}, typed_inputs=()),
    "HannWindow": _rule({"FP32", "FP16"}, typed_inputs=()),
    "STFT": _rule({"FP32"}, const_inputs={1: "frame_step", 2: "window"}),
}

UNSUPPORTED_OPS: dict[str, str] = {
    # [M] rows marked N. Bitwise and shift ops matter here: an integer hash for
    # a counter-based RNG has to be written with Mul/Add/Mod instead.
    **{op: "no TensorRT importer" for op in (
        "BitShift", "BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor",
        "AffineGrid", "Bernoulli", "Col2Im", "CenterCropPad", "Compress", "ConcatFromSequence",
        "ConvInteger", "DFT", "Det", "DynamicQuantizeLinear", "ImageDecoder", "MatMulInteger",
        "MaxRoiPool", "MaxUnpool", "MelWeightMatrix", "Multinomial", "NegativeLogLikelihoodLoss",
        "Optional", "OptionalGetElement", "OptionalHasElement", "QLinearConv", "QLinearMatMul",
        "RegexFullMatch", "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase",
        "SequenceInsert", "SequenceLength", "SequenceMap", "SoftmaxCrossEntropyLoss",
        "SplitToSequence", "StringConcat", "StringNormalizer", "StringSplit", "TfIdfVectorizer",
        "Unique",
    )},
}


ONNXRUNTIME_ONLY: dict[tuple[str, str], tuple[str, str]] = {
    ("com.microsoft", "MatMulNBits"): (
        "onnxruntime-only (MatMulNBits is a contrib op); export int8, fp16 or bf16 for TensorRT",
        "a default-domain MatMul: `sf-trt export --weights int8` (or `--weights float32 --precision fp16|bf16`); "
        "a q4, int4 or gguf model directory runs on onnxruntime only",
    ),
    **{("com.microsoft", op): (
        f"onnxruntime-only ({op} is a contrib op onnxruntime's CPU backend fuses the decoder into as it loads it)",
        "the decoder as exported, decoder.onnx of its model directory, in standard ONNX",
    ) for op in ("RotaryEmbedding", "SkipSimplifiedLayerNormalization")},
}
"""Contrib ops sf-trt export writes for onnxruntime alone, and what to export for TensorRT instead."""


def _fmt_types(types: Iterable[str]) -> str:
    order = ["FP32", "FP16", "BF16", "INT32", "INT64", "BOOL", "UINT8", "INT8", "FP8", "INT4", "FP4"]
    ts = set(types)
    return ", ".join([t for t in order if t in ts] + sorted(ts - set(order)))


# -- the walk ------------------------------------------------------------------


@dataclasses.dataclass
class _Scope:
    """Types, shapes and constants visible in one (sub)graph, outer scopes included."""

    types: dict[str, int]
    shapes: dict[str, tuple[int | str, ...]]
    consts: dict[str, onnx.TensorProto | None]
    """Build-time constants by name: the tensor, or None when its value is external."""
    graph_io: set[str]

    def child(self) -> "_Scope":
        return _Scope(dict(self.types), dict(self.shapes), dict(self.consts), set())


class _NodeView:
    def __init__(self, node: onnx.NodeProto, scope: _Scope, opset: int) -> None:
        self.node = node
        self.scope = scope
        self.opset = opset
        self.op_type = node.op_type
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self._attrs = {a.name: a for a in node.attribute}

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default):
        a = self._attrs.get(name)
        if a is None:
            return default
        value = onnx.helper.get_attribute_value(a)
        return value.decode() if isinstance(value, bytes) else value

    def input_type(self, i: int) -> str | None:
        if i >= len(self.inputs) or not self.inputs[i]:
            return None
        t = self.scope.types.get(self.inputs[i])
        return None if not t else _type_name(t)

    def output_type(self, i: int) -> str | None:
        if i >= len(self.outputs) or not self.outputs[i]:
            return None
        t = self.scope.types.get(self.outputs[i])
        return None if not t else _type_name(t)

    def input_shape(self, i: int) -> tuple[int | str, ...] | None:
        if i >= len(self.inputs) or not self.inputs[i]:
            return None
        return self.scope.shapes.get(self.inputs[i])

    def is_const(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] in self.scope.consts

    def const_value(self, i: int) -> np.ndarray | None:
        t = self.scope.consts.get(self.inputs[i]) if i < len(self.inputs) else None
        if t is None:
            return None
        try:
            return numpy_helper.to_array(t)
        except Exception:  # external data not loaded: constant, value unknown
            return None


def _shape_of(vi: onnx.ValueInfoProto) -> tuple[int, tuple[int | str, ...] | None]:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        return 0, None
    if not tt.HasField("shape"):
        return tt.elem_type, None
    dims: list[int | str] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or "?")
    return tt.elem_type, tuple(dims)


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    for a in node.attribute:
        if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
            return a.t
        if a.name in ("value_int", "value_ints"):
            v = onnx.helper.get_attribute_value(a)
            return numpy_helper.from_array(np.asarray(v, dtype=np.int64))
        if a.name in ("value_float", "value_floats"):
            v = onnx.helper.get_attribute_value(a)
            return numpy_helper.from_array(np.asarray(v, dtype=np.float32))
    return None


def _has_external(t: onnx.TensorProto) -> bool:
    return t.data_location == TensorProto.EXTERNAL and not t.raw_data


_Functions = Mapping[tuple[str, str], onnx.FunctionProto]


def _walk_graph(
    graph: onnx.GraphProto, scope: _Scope, path: str, opset: int, plugins: frozenset[str],
    functions: _Functions, out: list[Finding],
) -> None:
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        elem, shape = _shape_of(vi)
        if elem:
            scope.types[vi.name] = elem
        if shape is not None:
            scope.shapes[vi.name] = shape
    for t in graph.initializer:
        scope.types.setdefault(t.name, t.data_type)
        scope.shapes.setdefault(t.name, tuple(int(d) for d in t.dims))
        scope.consts[t.name] = None if _has_external(t) else t
    # Graph inputs shadow initializers of the same name (old-style "input with default").
    for vi in graph.input:
        scope.consts.pop(vi.name, None)
    scope.graph_io.update(vi.name for vi in graph.input)
    scope.graph_io.update(vi.name for vi in graph.output)

    _check_io(graph, path, out)
    _walk_nodes(graph.node, scope, path, opset, plugins, functions, out)


def _walk_nodes(
    nodes: Iterable[onnx.NodeProto], scope: _Scope, path: str, opset: int, plugins: frozenset[str],
    functions: _Functions, out: list[Finding],
) -> None:
    for index, node in enumerate(nodes):
        name = node.name or f"#{index}"
        if node.op_type == "Constant":
            t = _constant_tensor(node)
            if node.output:
                scope.consts[node.output[0]] = t
                if t is not None:
                    scope.types.setdefault(node.output[0], t.data_type)
        fn = functions.get((node.domain, node.op_type))
        if fn is not None and node.op_type not in plugins:
            # The parser inlines a model-local function it has no plugin for:
            # check its body, the call's inputs standing for the function's.
            inner = scope.child()
            for formal, actual in zip(fn.input, node.input):
                for table in (inner.types, inner.shapes, inner.consts):
                    if actual in table:
                        table[formal] = table[actual]
            fn_opset = next((int(o.version) for o in fn.opset_import if o.domain in _DEFAULT_DOMAINS), opset)
            _walk_nodes(fn.node, inner, f"{path}/{name}:{fn.name}", fn_opset, plugins, functions, out)
            continue
        out.extend(_check_node(node, name, scope, path, opset, plugins))
        for a in node.attribute:
            subgraphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for k, sub in enumerate(subgraphs):
                sub_path = f"{path}/{name}.{a.name}" + (f"[{k}]" if len(subgraphs) > 1 else "")
                _walk_graph(sub, scope.child(), sub_path, opset, plugins, functions, out)


def _check_io(graph: onnx.GraphProto, path: str, out: list[Finding]) -> None:
    """[D] every network input and output must have a TensorRT DataType."""
    for kind, vis in (("input", graph.input), ("output", graph.output)):
        for vi in vis:
            elem, _ = _shape_of(vi)
            if not elem:
                continue
            name = _type_name(elem)
            if name == "DOUBLE":
                out.append(Finding(path, vi.name, "", f"graph {kind} of type DOUBLE", "a TensorRT type (cast to FP32 in the graph)"))
            elif name not in TRT_TYPES - QUANT:
                out.append(Finding(path, vi.name, "", f"graph {kind} of type {name}", f"one of {_fmt_types(TRT_TYPES - QUANT)}"))


def _check_node(
    node: onnx.NodeProto, name: str, scope: _Scope, path: str, opset: int, plugins: frozenset[str]
) -> list[Finding]:
    def finding(problem: str, expected: str, severity: str = "error") -> Finding:
        return Finding(path, name, node.op_type, problem, expected, severity)

    if node.domain not in _DEFAULT_DOMAINS:
        if node.op_type in plugins:
            return []
        if (node.domain, node.op_type) in ONNXRUNTIME_ONLY:
            problem, expected = ONNXRUNTIME_ONLY[(node.domain, node.op_type)]
            return [finding(problem, expected)]
        return [
            finding(
                f"op from domain {node.domain!r}, which TensorRT's parser has no importer for",
                "a default-domain ONNX op, or a TensorRT plugin of this op_type declared with --plugin",
            )
        ]
    if node.op_type in UNSUPPORTED_OPS:
        return [finding(f"{node.op_type} is not supported ({UNSUPPORTED_OPS[node.op_type]})", "ops TensorRT imports (see docs/tensorrt.md)")]
    rule = OP_RULES.get(node.op_type)
    if rule is None:
        if node.op_type in plugins:
            return []
        return [finding(f"{node.op_type} is not in the table of ops TensorRT imports", "an op listed in export/trt_support.py OP_RULES, or a declared plugin")]

    view = _NodeView(node, scope, opset)
    found: list[Finding] = []
    typed = [(f"input {i}", view.input_type(i)) for i in rule.typed_inputs]
    typed += [(f"output {i}", view.output_type(i)) for i in rule.typed_outputs]
    for what, dtype in typed:
        if dtype is None:
            continue
        if dtype == "DOUBLE":
            found.append(finding(f"{what} is DOUBLE", "FP32 (TensorRT casts DOUBLE down, clamping to +-FLT_MAX)", "warning"))
        elif dtype not in rule.types:
            found.append(finding(f"{what} of type {dtype}", f"one of {_fmt_types(rule.types)}"))
    for i, arg in rule.const_inputs.items():
        if i < len(node.input) and node.input[i] and not view.is_const(i):
            found.append(finding(f"{arg} ({node.input[i]!r}) is computed at run time", f"{arg} from an initializer or Constant"))
    if rule.check is not None:
        found.extend(finding(p, e) for p, e in rule.check(view))
    # [D] UINT8 only at the network boundary; quantized types only around Q/DQ.
    for o in node.output:
        t = scope.types.get(o)
        if not t:
            continue
        tname = _type_name(t)
        if tname == "UINT8" and o not in scope.graph_io:
            found.append(finding(f"intermediate tensor {o!r} of type UINT8", "UINT8 only as a network input or output"))
        elif tname in QUANT and node.op_type not in ("QuantizeLinear", "Constant"):
            found.append(finding(f"tensor {o!r} of type {tname}", f"{tname} only as a QuantizeLinear output"))
        elif tname == "DOUBLE" and node.op_type not in ("Cast", "Constant"):
            found.append(finding(f"tensor {o!r} of type DOUBLE", "FP32 (TensorRT casts DOUBLE down)", "warning"))
        elif tname not in TRT_TYPES and tname != "DOUBLE":
            found.append(finding(f"tensor {o!r} of type {tname}", f"a TensorRT type: {_fmt_types(TRT_TYPES)}"))
    return found


# -- entry points --------------------------------------------------------------


def _default_opset(model: onnx.ModelProto) -> int | None:
    for imp in model.opset_import:
        if imp.domain in _DEFAULT_DOMAINS:
            return int(imp.version)
    return None


def check_graph(
    model: onnx.ModelProto, *, max_opset: int = DEFAULT_MAX_OPSET, plugins: Iterable[str] = ()
) -> list[Finding]:
    """Everything in ``model`` TensorRT's ONNX parser would refuse (errors)
    or change (warnings). An empty list means it parses.

    ``max_opset``: the highest default-domain opset the target TensorRT
    imports (20 for 10.0, 24 for 10.15). ``plugins``: op types backed by
    TensorRT plugins the build will load; nodes of those types pass whatever
    their domain. The model is not modified.
    """
    plugin_set = frozenset(plugins)
    findings: list[Finding] = []
    opset = _default_opset(model)
    if opset is None:
        findings.append(Finding("main", "<model>", "", "no default-domain opset import", f"an opset in {MIN_OPSET}..{max_opset}"))
        opset = max_opset
    elif not MIN_OPSET <= opset <= max_opset:
        findings.append(
            Finding("main", "<model>", "", f"default-domain opset {opset}", f"an opset in {MIN_OPSET}..{max_opset} (pass --max-opset for a newer TensorRT)")
        )
    work = model
    try:
        work = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:  # shape inference is advisory: dtype checks then see less
        findings.append(Finding("main", "<model>", "", f"ONNX shape inference failed ({exc})", "a graph ONNX can infer types for", "warning"))
    functions = {(f.domain, f.name): f for f in work.functions}
    _walk_graph(work.graph, _Scope({}, {}, {}, set()), "main", opset, plugin_set, functions, findings)
    findings.extend(_unused_inputs(model))
    findings.extend(_data_dependent_shapes(model))
    findings.extend(_exactness_findings(model))
    return findings


# -- shapes that depend on values -------------------------------------------------------------

SHAPE_INPUTS: dict[str, dict[int, str]] = {
    "Range": {0: "start", 1: "limit", 2: "delta"},
    "Reshape": {1: "shape"}, "Expand": {1: "shape"}, "Tile": {1: "repeats"}, "ConstantOfShape": {0: "input"},
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"}, "Pad": {1: "pads", 3: "axes"},
    "Resize": {2: "scales", 3: "sizes"}, "Upsample": {1: "scales"}, "OneHot": {1: "depth"}, "TopK": {1: "K"},
    "Split": {1: "split"}, "Squeeze": {1: "axes"}, "Unsqueeze": {1: "axes"}, "CenterCropPad": {1: "shape"},
    "Loop": {0: "M", 1: "cond"},
    **{op: {1: "axes"} for op in (
        "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
        "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
    )},
}
"""[C] Inputs that size an op's output: computed from the values of a graph input, they make the
engine's shapes depend on data, which one fixed profile cannot hold."""
VALUE_SHAPED_OPS = frozenset({"NonZero", "Compress", "Unique", "NonMaxSuppression"})
"""[C] Ops whose output size is the count of something in their input's values."""
_SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})
"""Ops whose outputs depend on their input's shape, not its values."""

_DATA_DEPENDENT_EXPECTED = (
    "every dim fixed by the engine's one profile, sized by input shapes or constants, not values "
    "(a decoder's key extent is the length of its bound caches, a shape, never a value of `positions`)"
)


def _data_dependent_shapes(model: onnx.ModelProto) -> list[Finding]:
    """[C] Nodes whose output shape depends on the values of graph inputs: a size-giving input
    (:data:`SHAPE_INPUTS`) computed from an input's values (through anything but ``Shape`` /
    ``Size``), or an op whose output size counts values (:data:`VALUE_SHAPED_OPS`)."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    sources: dict[str, frozenset[str]] = {vi.name: frozenset([vi.name]) for vi in graph.input if vi.name not in inits}
    first: dict[str, tuple[str, str, str, frozenset[str]]] = {}  # size-giving tensor -> its first node
    also: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        name = node.name or f"#{index}"
        from_values = frozenset().union(*(sources.get(i, frozenset()) for i in node.input if i))
        if node.op_type in VALUE_SHAPED_OPS and from_values:
            first.setdefault(f"{name}/output", (name, node.op_type, "its output size counts the values of", from_values))
        for i, arg in SHAPE_INPUTS.get(node.op_type, {}).items():
            tensor = node.input[i] if i < len(node.input) else ""
            if tensor and sources.get(tensor):
                if tensor in first:
                    also[tensor] = also.get(tensor, 0) + 1
                else:
                    first[tensor] = (name, node.op_type, f"input {arg} ({tensor!r}) is computed from the values of", sources[tensor])
        if node.op_type not in _SHAPE_ONLY_OPS and from_values:
            sources.update({o: from_values for o in node.output if o})
    return [
        Finding(
            "main", name, op, f"{what} graph input(s) {sorted(inputs)}, so the shapes after it depend on data"
            + (f" (the same tensor sizes {also[tensor]} more node(s))" if also.get(tensor) else ""),
            _DATA_DEPENDENT_EXPECTED,
        )
        for tensor, (name, op, what, inputs) in first.items()
    ]


def _used_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name a node of ``graph`` reads (subgraphs and called functions included)."""
    used = set()
    for node in graph.node:
        used.update(node.input)
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                used |= _used_names(sub)
    return used


def _unused_inputs(model: onnx.ModelProto) -> list[Finding]:
    """[C] Graph inputs no node reads: TensorRT's parser drops them, so the engine would not
    have inputs the runtime feeds (and its manifest lists)."""
    inits = {t.name for t in model.graph.initializer}
    used = _used_names(model.graph) | {o.name for o in model.graph.output}
    return [
        Finding(
            "main", vi.name, "", "graph input read by no node; TensorRT drops it, so the engine would not have it",
            "every graph input read by a node (the greedy and top-k/top-p-off verify variants are onnxruntime-only)",
        )
        for vi in model.graph.input
        if vi.name not in inits and vi.name not in used
    ]


_EXACT_EXPECTED = (
    "integer operands and results proven inside (-2**24, 2**24) from the input and dim ranges the graph "
    f"declares in metadata {RANGES_KEY!r} (TensorRT's integer division may round through float32: "
    "NVIDIA/TensorRT#4702; export/OPS.md, 'Integer arithmetic')"
)


def _exactness_findings(model: onnx.ModelProto) -> list[Finding]:
    """Integer arithmetic not proven exact on every backend (sf_trt.export.int_bounds)."""
    try:
        found = arithmetic_findings(model)
    except ValueError as exc:  # a malformed ranges record
        return [Finding("main", "<model>", "", str(exc), "a JSON ranges record (sf_trt.graphs.ranges)")]
    return [Finding("main", f.node, f.op_type, f.problem, _EXACT_EXPECTED, f.severity) for f in found]


def errors_in(findings: Iterable[Finding]) -> list[Finding]:
    """The findings that make TensorRT refuse the graph."""
    return [f for f in findings if f.severity == "error"]


def check_file(path: str | os.PathLike, **kw) -> list[Finding]:
    """:func:`check_graph` on an ``.onnx`` file; external weights are not read."""
    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as exc:
        return [Finding("main", "<file>", "", f"cannot load {os.fspath(path)!r} as ONNX ({type(exc).__name__}: {exc})", "a valid .onnx file")]
    return check_graph(model, **kw)


def check_dir(path: str | os.PathLike, **kw) -> dict[str, list[Finding]]:
    """:func:`check_file` on every ``*.onnx`` directly in ``path``, by file name."""
    root = Path(path)
    if not root.is_dir():
        raise NotADirectoryError(f"check_dir: {os.fspath(path)!r} is not a directory")
    return {p.name: check_file(p, **kw) for p in sorted(root.glob("*.onnx"))}


def format_findings(findings: Iterable[Finding], *, indent: str = "  ") -> str:
    return "\n".join(indent + str(f) for f in findings)

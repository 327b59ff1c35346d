"""The TensorRT op-support check (sf_trt.export.trt_support): what the parser takes, refused by node."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from sf_trt.export.registry import GRAPHS
from sf_trt.export.trt_support import (
    OP_RULES,
    TOPK_MAX_K,
    UNSUPPORTED_OPS,
    check_dir,
    check_graph,
    errors_in,
)
from sf_trt.graphs.ranges import declare_ranges

ROOT = Path(__file__).resolve().parents[2]


def model(nodes, inputs, outputs, inits=(), opset=17, extra_domains=(), functions=()):
    graph = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    opsets = [h.make_opsetid("", opset)] + [h.make_opsetid(d, 1) for d in extra_domains]
    return h.make_model(graph, opset_imports=opsets, functions=list(functions))


def vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


def i64(name, value):
    return nh.from_array(np.asarray(value, np.int64), name)


X = vi("x", T.FLOAT, ["rows", 512])


XI = vi("xi", T.INT64, ["rows"])


Y = vi("y", T.FLOAT, None)


YI = vi("yi", T.INT64, None)


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_registry_graph_passes_the_op_check(name):
    found = errors_in(check_graph(GRAPHS[name]()))
    assert found == [], "\n".join(map(str, found))


def _bitshift():
    return model([h.make_node("BitShift", ["xi", "xi"], ["yi"], name="hash_shift", direction="LEFT")], [XI], [YI])


def _bitwise_and():
    return model([h.make_node("BitwiseAnd", ["xi", "xi"], ["yi"], name="hash_mask")], [XI], [YI], opset=18)


def _topk_k4000():
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], name="topk_big")
    return model([node], [vi("x", T.FLOAT, ["rows", 8192])], [vi("v", T.FLOAT, None), vi("i", T.INT64, None)], [i64("k", [4000])])


def _topk_unsorted():
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], name="topk_unsorted", sorted=0)
    return model([node], [X], [vi("v", T.FLOAT, None), vi("i", T.INT64, None)], [i64("k", [64])])


def _topk_runtime_k():
    node = h.make_node("TopK", ["x", "kin"], ["v", "i"], name="topk_dynamic")
    return model([node], [X, vi("kin", T.INT64, [1])], [vi("v", T.FLOAT, None), vi("i", T.INT64, None)])


def _cumsum_runtime_axis():
    node = h.make_node("CumSum", ["x", "axis"], ["y"], name="cdf")
    return model([node], [X, vi("axis", T.INT64, [])], [Y])


def _cumsum_int():
    node = h.make_node("CumSum", ["xi", "axis"], ["yi"], name="cdf_int")
    return model([node], [XI], [YI], [i64("axis", 0)])


def _com_microsoft():
    node = h.make_node("FusedMatMul", ["x", "x"], ["y"], name="fused", domain="com.microsoft")
    return model([node], [X], [Y], extra_domains=["com.microsoft"])


def _mod_float_fmod0():
    return model([h.make_node("Mod", ["x", "x"], ["y"], name="float_mod")], [X], [Y])


def _opset_too_new():
    return model([h.make_node("Relu", ["x"], ["y"], name="relu")], [X], [Y], opset=22)


def _reduce_runtime_axes():
    node = h.make_node("ReduceMax", ["x", "axes"], ["y"], name="rmax")
    return model([node], [X, vi("axes", T.INT64, [1])], [Y], opset=18)


def _double_io():
    return model([h.make_node("Identity", ["x"], ["y"], name="ident")], [vi("x", T.DOUBLE, [4])], [vi("y", T.DOUBLE, [4])])


def _int16_cast():
    return model([h.make_node("Cast", ["xi"], ["y16"], name="to_int16", to=T.INT16)], [XI], [vi("y16", T.INT16, None)])


def _bitshift_in_loop_body():
    body = h.make_graph(
        [h.make_node("BitShift", ["c_in", "c_in"], ["c_out"], name="body_shift", direction="RIGHT"),
         h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body",
        [vi("iter", T.INT64, []), vi("cond_in", T.BOOL, []), vi("c_in", T.INT64, [])],
        [vi("cond_out", T.BOOL, []), vi("c_out", T.INT64, [])],
    )
    node = h.make_node("Loop", ["trip", "cond", "c0"], ["c_final"], name="rng_loop", body=body)
    return model(
        [node], [vi("c0", T.INT64, [])], [vi("c_final", T.INT64, [])],
        [i64("trip", 3), nh.from_array(np.array(True), "cond")],
    )


def _unbounded_int64_mod():
    """``key % 1000003`` on an int64 input with no declared range: TensorRT may round the
    division through float32 (NVIDIA/TensorRT#4702)."""
    return model([h.make_node("Mod", ["xi", "m"], ["yi"], name="key_mod", fmod=0)], [XI], [YI], [i64("m", 1000003)])


def _wide_int64_div():
    """A declared range, but one that reaches past 2**24."""
    m = model([h.make_node("Div", ["xi", "d"], ["yi"], name="wide_div")], [XI], [YI], [i64("d", 3)])
    return declare_ranges(m, inputs={"xi": (0, 2**40)})


def _bitshift_in_local_function():
    fn = h.make_function(
        "sf.local", "Scramble", ["a"], ["b"],
        [h.make_node("BitShift", ["a", "a"], ["b"], name="fn_shift", direction="LEFT")],
        opset_imports=[h.make_opsetid("", 17)],
    )
    node = h.make_node("Scramble", ["xi"], ["yi"], name="scramble", domain="sf.local")
    return model([node], [XI], [YI], extra_domains=["sf.local"], functions=[fn])


BAD = {
    # name: (graph, node the finding names, text the finding contains)
    "BitShift": (_bitshift, "hash_shift", "BitShift is not supported"),
    "BitwiseAnd": (_bitwise_and, "hash_mask", "BitwiseAnd is not supported"),
    "TopK K=4000": (_topk_k4000, "topk_big", f"0 < K < {TOPK_MAX_K}"),
    "TopK sorted=0": (_topk_unsorted, "topk_unsorted", "sorted=0"),
    "TopK runtime K": (_topk_runtime_k, "topk_dynamic", "computed at run time"),
    "CumSum runtime axis": (_cumsum_runtime_axis, "cdf", "axis ('axis') is computed at run time"),
    "CumSum on INT64": (_cumsum_int, "cdf_int", "input 0 of type INT64"),
    "com.microsoft op": (_com_microsoft, "fused", "domain 'com.microsoft'"),
    "Mod fmod=0 on floats": (_mod_float_fmod0, "float_mod", "fmod=0 on FP32"),
    "opset 22": (_opset_too_new, "<model>", "opset 22"),
    "ReduceMax runtime axes": (_reduce_runtime_axes, "rmax", "axes ('axes') is computed at run time"),
    "DOUBLE graph input": (_double_io, "x", "graph input of type DOUBLE"),
    "Cast to INT16": (_int16_cast, "to_int16", "to=INT16"),
    "BitShift in a Loop body": (_bitshift_in_loop_body, "body_shift", "BitShift is not supported"),
    "BitShift in a local function": (_bitshift_in_local_function, "fn_shift", "BitShift is not supported"),
    "unbounded int64 Mod": (_unbounded_int64_mod, "key_mod", "no declared range"),
    "int64 Div past 2**24": (_wide_int64_div, "wide_div", "reach(es) 2**24"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_graph_with_an_unsupported_node_is_refused_with_the_node_named(case):
    make, node, text = BAD[case]
    found = errors_in(check_graph(make()))
    assert found, f"{case}: nothing found"
    hits = [f for f in found if f.node == node and (text in f.problem or text in f.expected)]
    assert hits, f"{case}: expected a finding on {node!r} mentioning {text!r}; got:\n" + "\n".join(map(str, found))
    assert node in str(hits[0]) and hits[0].expected


def test_subgraph_findings_say_where_the_node_is():
    (finding,) = [f for f in errors_in(check_graph(_bitshift_in_loop_body())) if f.node == "body_shift"]
    assert finding.graph == "main/rng_loop.body"
    assert str(finding).startswith("error: main/rng_loop.body/body_shift (BitShift): ")


def test_what_passes():
    ok = [
        # TopK with a constant K under the bound, sorted; CumSum with a constant axis; Mod on ints
        model([h.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")], [X], [vi("v", T.FLOAT, None), vi("i", T.INT64, None)], [i64("k", [64])]),
        model([h.make_node("CumSum", ["x", "axis"], ["y"], name="cdf")], [X], [Y], [i64("axis", 1)]),
        declare_ranges(model([h.make_node("Mod", ["xi", "m"], ["yi"], name="imod")], [XI], [YI], [i64("m", 7)]), inputs={"xi": (-(2**20), 2**20)}),
        model([h.make_node("Mod", ["x", "x"], ["y"], name="fmod", fmod=1)], [X], [Y]),
        # axis from a Constant node counts as a build-time constant
        model(
            [h.make_node("Constant", [], ["axis"], name="c", value=i64("v", 1)), h.make_node("CumSum", ["x", "axis"], ["y"], name="cdf")],
            [X], [Y],
        ),
        # a newer TensorRT: opset 22 passes with max_opset=24
    ]
    for m in ok:
        assert errors_in(check_graph(m)) == [], "\n".join(map(str, check_graph(m)))
    assert errors_in(check_graph(_opset_too_new(), max_opset=24)) == []


def test_a_declared_plugin_lets_its_op_through():
    assert errors_in(check_graph(_com_microsoft(), plugins=["FusedMatMul"])) == []


def test_double_inside_the_graph_is_a_warning_not_an_error():
    m = model(
        [h.make_node("Cast", ["x"], ["d"], name="to_double", to=T.DOUBLE), h.make_node("Cast", ["d"], ["y"], name="back", to=T.FLOAT)],
        [X], [vi("y", T.FLOAT, None)],
    )
    found = check_graph(m)
    assert errors_in(found) == []
    assert any(f.severity == "warning" and f.node == "back" for f in found)


def test_the_table_is_disjoint_and_covers_what_the_issue_names():
    assert not set(OP_RULES) & set(UNSUPPORTED_OPS)
    for op in ("BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"):
        assert op in UNSUPPORTED_OPS
    for op in ("TopK", "CumSum", "Mod", "Gather", "MatMul", "Softmax", "Where"):
        assert op in OP_RULES


def test_check_dir_reports_per_file(tmp_path):
    onnx.save(_bitshift(), tmp_path / "bad.onnx")
    onnx.save(model([h.make_node("Relu", ["x"], ["y"], name="relu")], [X], [Y]), tmp_path / "good.onnx")
    result = check_dir(tmp_path)
    assert sorted(result) == ["bad.onnx", "good.onnx"]
    assert result["good.onnx"] == [] and errors_in(result["bad.onnx"])


def test_a_graph_with_unproven_integer_arithmetic_other_than_division_gets_a_warning():
    m = model([h.make_node("Mul", ["xi", "xi"], ["yi"], name="square")], [XI], [YI])
    found = check_graph(m)
    assert errors_in(found) == [] and [(f.node, f.severity) for f in found] == [("square", "warning")]


def test_local_function_findings_name_the_call_site():
    (finding,) = errors_in(check_graph(_bitshift_in_local_function()))
    assert finding.graph == "main/scramble:Scramble" and finding.node == "fn_shift"


# -- shapes that depend on values, and onnxruntime-only ops -------------------------------------

POS = vi("positions", T.INT64, ["batch", "rows_per_lane"])


def _key_extent_from_positions():
    """What decoder_pass.onnx does: a key extent of max(positions) + 1, then a Range and a Slice by it."""
    nodes = [
        h.make_node("ReduceMax", ["positions"], ["pmax"], name="pmax", keepdims=0),
        h.make_node("Add", ["pmax", "one"], ["extent"], name="extent"),
        h.make_node("Range", ["zero", "extent", "one"], ["keys"], name="key_idx"),
        h.make_node("Unsqueeze", ["extent", "axis0"], ["ends"], name="ends"),
        h.make_node("Slice", ["cache", "zero1", "ends", "axis0"], ["window"], name="window_a"),
        h.make_node("Slice", ["cache", "zero1", "ends", "axis0"], ["window2"], name="window_b"),
    ]
    m = model(nodes, [POS, vi("cache", T.FLOAT, [64, 8])], [vi("keys", T.INT64, None), vi("window", T.FLOAT, None), vi("window2", T.FLOAT, None)],
              [i64("one", 1), i64("zero", 0), i64("zero1", [0]), i64("axis0", [0])])
    return declare_ranges(m, inputs={"positions": (0, 63)})


def _nonzero_of_input():
    return model([h.make_node("NonZero", ["x"], ["nz"], name="nz")], [vi("x", T.FLOAT, [8])], [vi("nz", T.INT64, None)])


def _reshape_by_values():
    nodes = [h.make_node("Reshape", ["x", "shape_in"], ["y"], name="reshape_by_values")]
    return model(nodes, [X, vi("shape_in", T.INT64, [2])], [Y])


def _matmul_nbits():
    node = h.make_node("MatMulNBits", ["x", "w", "scales"], ["y"], name="l0_q_proj", domain="com.microsoft", K=512, N=512, bits=4, block_size=32)
    return model([node], [X], [Y], [nh.from_array(np.zeros((512, 16, 16), np.uint8), "w"), nh.from_array(np.ones(8192, np.float32), "scales")],
                 extra_domains=["com.microsoft"])


REFUSED = {
    # name: (graph, node, the finding's whole text)
    "key extent from positions (Range)": (
        _key_extent_from_positions, "key_idx",
        "error: key_idx (Range): input limit ('extent') is computed from the values of graph input(s) ['positions'], so the shapes "
        "after it depend on data; expected every dim fixed by the engine's one profile, sized by input shapes or constants, not "
        "values (a decoder's key extent is the length of its bound caches, a shape, never a value of `positions`)",
    ),
    "key extent from positions (Slice, once for two nodes)": (
        _key_extent_from_positions, "window_a",
        "error: window_a (Slice): input ends ('ends') is computed from the values of graph input(s) ['positions'], so the shapes "
        "after it depend on data (the same tensor sizes 1 more node(s)); expected every dim fixed",
    ),
    "NonZero of an input": (_nonzero_of_input, "nz", "error: nz (NonZero): its output size counts the values of graph input(s) ['x']"),
    "Reshape by an input's values": (_reshape_by_values, "reshape_by_values", "input shape ('shape_in') is computed from the values of graph input(s) ['shape_in']"),
    "q4: MatMulNBits": (
        _matmul_nbits, "l0_q_proj",
        "error: l0_q_proj (MatMulNBits): onnxruntime-only (MatMulNBits is a contrib op); export int8, fp16 or bf16 for TensorRT; "
        "expected a default-domain MatMul: `sf-trt export --weights int8` (or `--weights float32 --precision fp16|bf16`); "
        "a q4, int4 or gguf model directory runs on onnxruntime only",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_check_refuses_with_the_message(case):
    make, node, text = REFUSED[case]
    hits = [str(f) for f in errors_in(check_graph(make())) if f.node == node]
    assert len(hits) == 1 and text in hits[0], hits


def test_a_key_extent_refusal_is_one_finding_per_size_giving_tensor():
    assert sorted(f.node for f in errors_in(check_graph(_key_extent_from_positions()))) == ["key_idx", "window_a"]


def test_shapes_from_shape_ops_and_values_that_move_no_shape_pass():
    """``Shape`` cuts the values: a Range over an input's shape is one shape; positions used as
    values (a mask, scatter indices) size nothing."""
    nodes = [
        h.make_node("Shape", ["positions"], ["pshape"], name="pshape"),
        h.make_node("Gather", ["pshape", "one"], ["rows"], name="rows", axis=0),
        h.make_node("Range", ["zero", "rows", "one"], ["ids"], name="row_ids"),
        h.make_node("LessOrEqual", ["ids", "positions"], ["mask"], name="mask"),
    ]
    m = model(nodes, [POS], [vi("ids", T.INT64, None), vi("mask", T.BOOL, None)], [i64("one", 1), i64("zero", 0)])
    assert errors_in(check_graph(m)) == [], "\n".join(map(str, check_graph(m)))


def test_both_decoder_forms_pass_the_op_check(tiny):
    """The pass form's key extent is its bound caches' length, a shape, no longer a value of
    `positions`: the op check finds nothing (trt_build refuses it by its inputs)."""
    from sf_trt.export.decoder_graph import build_decoder_graph, pass_form

    cfg, weights = tiny
    slots = build_decoder_graph(cfg, weights)
    assert errors_in(check_graph(slots)) == []
    assert errors_in(check_graph(pass_form(slots))) == []

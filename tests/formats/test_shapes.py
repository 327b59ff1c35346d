"""Engine I/O shapes and profiles (sf_trt.formats.shapes)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from onnx import TensorProto as T
from onnx import helper as h
from sf_trt.export.registry import GRAPHS

from sf_trt.formats.shapes import (
    DIM_ROLES,
    FIXED_ROLES,
    Profile,
    ShapeError,
    ShapeLimits,
    derive_profiles,
)


def _graph_with_input_dims(dims):
    x = h.make_tensor_value_info("x", T.FLOAT, dims)
    y = h.make_tensor_value_info("y", T.FLOAT, dims)
    return h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [x], [y]), opset_imports=[h.make_opsetid("", 17)])


def test_profiles_come_from_the_graphs_named_dims():
    graph = GRAPHS["copy_model"]()  # history [4, 128] static; lanes, positions [rows]; logits [rows, 512]
    cfg = ShapeLimits(max_rows_per_pass=64, max_lanes=4, max_context=128)
    p = derive_profiles(graph, cfg)
    assert p.dims == {"rows": (1, 4, 64)}  # opt: one decode row per lane
    assert p.inputs == {"lanes": ((1,), (4,), (64,)), "positions": ((1,), (4,), (64,))}
    assert p.static == {"history": (4, 128)}
    assert Profile.from_json(json.loads(json.dumps(p.to_json()))) == p
    p2 = derive_profiles(graph, dataclasses.replace(cfg, opt_rows_per_pass=32))
    assert p2.dims["rows"] == (1, 32, 64)


def test_every_role_of_the_dim_table_is_bounded_by_the_config():
    cfg = ShapeLimits(max_rows_per_pass=100, max_lanes=7, max_context=300)
    p = derive_profiles(_graph_with_input_dims(["lanes", "context", "rows"]), cfg)
    assert p.inputs["x"] == ((1, 1, 1), (7, 300, 7), (7, 300, 100))
    for name, role in DIM_ROLES.items():
        lo, _, hi = derive_profiles(_graph_with_input_dims([name]), cfg).dims[name]
        if role in FIXED_ROLES:
            assert lo == hi == {"lane_slots": 7, "cache_len": 301}[role], name
        else:
            assert (lo, hi) == (1, getattr(cfg, f"max_{role}")), name


def test_an_unknown_or_unnamed_dynamic_dim_is_refused_by_name():
    with pytest.raises(ShapeError, match=r"input 'x' dim 1 is named 'seq_len', which has no role; expected one of"):
        derive_profiles(_graph_with_input_dims(["rows", "seq_len"]), ShapeLimits())
    unnamed = _graph_with_input_dims(["rows", 3])
    unnamed.graph.input[0].type.tensor_type.shape.dim[1].Clear()
    with pytest.raises(ShapeError, match=r"graph input 'x' dim 1 is dynamic but unnamed"):
        derive_profiles(unnamed, ShapeLimits())


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_registry_graph_has_a_profile(name):
    graph = GRAPHS[name]()
    p = derive_profiles(graph, ShapeLimits())
    for inp, (lo, mid, hi) in p.inputs.items():
        assert all(a <= b <= c for a, b, c in zip(lo, mid, hi)), inp

"""Engine I/O shapes and profiles (sf_trt.formats.shapes)."""

from __future__ import annotations

import json

import pytest
from onnx import TensorProto as T
from onnx import helper as h
from sf_trt.abi import LOGIT_BIAS_MAX_TOKENS, STOP_TOKEN_IDS_MAX
from sf_trt.export.registry import GRAPHS

from sf_trt.formats.shapes import (
    DIM_ROLES,
    ROLES,
    Profile,
    ShapeError,
    ShapeLimits,
    derive_profiles,
)


def _graph_with_input_dims(dims):
    x = h.make_tensor_value_info("x", T.FLOAT, dims)
    y = h.make_tensor_value_info("y", T.FLOAT, dims)
    return h.make_model(h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [x], [y]), opset_imports=[h.make_opsetid("", 17)])


def test_profiles_come_from_the_graphs_named_dims_and_are_fixed():
    graph = GRAPHS["copy_model"]()  # history [4, 128] static; lanes, positions [rows]; logits [rows, 512]
    cfg = ShapeLimits(max_lanes=4, rows_per_lane=16, max_context=128)
    p = derive_profiles(graph, cfg)
    assert p.dims == {"rows": (64, 64, 64)}  # every run takes lanes x rows per lane rows
    assert p.inputs == {"lanes": ((64,), (64,), (64,)), "positions": ((64,), (64,), (64,))}
    assert p.static == {"history": (4, 128)} and p.unfixed() == []
    assert Profile.from_json(json.loads(json.dumps(p.to_json()))) == p


def test_the_decoders_profile_is_every_lane_slot_at_rows_per_lane():
    p = derive_profiles(GRAPHS["decoder"](), ShapeLimits(max_lanes=3, rows_per_lane=5, max_context=40))
    assert p.dims == {"batch": (3, 3, 3), "rows_per_lane": (5, 5, 5), "logit_rows": (15, 15, 15), "max_lanes": (3, 3, 3), "cache_len": (41, 41, 41)}
    assert p.inputs["input_ids"][0] == (3, 5) and p.inputs["logit_index"][0] == (15,) and p.inputs["past_key_0"][0][::2] == (3, 41)


def test_every_role_of_the_dim_table_is_sized_by_the_shapes():
    cfg = ShapeLimits(max_lanes=7, rows_per_lane=3, max_context=300)
    p = derive_profiles(_graph_with_input_dims(["lanes", "context", "rows"]), cfg)
    assert p.inputs["x"] == ((7, 300, 21),) * 3
    want = {"rows_per_pass": 21, "rows_per_lane": 3, "lanes": 7, "context": 300, "lane_slots": 7, "cache_len": 301,
            "adjust_entries": 300 + LOGIT_BIAS_MAX_TOKENS + STOP_TOKEN_IDS_MAX}
    assert set(want) == set(ROLES)
    for name, role in DIM_ROLES.items():
        assert derive_profiles(_graph_with_input_dims([name]), cfg).dims[name] == (want[role],) * 3, name


def test_shape_limits_refuse_what_is_not_a_size():
    for field in ("max_lanes", "rows_per_lane", "max_context"):
        with pytest.raises(ShapeError, match=rf"ShapeLimits: {field} must be an int >= 1 \(got 0\)"):
            ShapeLimits(**{field: 0})


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
    assert p.unfixed() == [], name

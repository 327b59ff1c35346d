"""Buffer plans of the TensorRT backend (sf_trt.backends.tensorrt.buffers), from graphs and manifests."""

from __future__ import annotations

import dataclasses

import pytest
from manifests import SHAPES, engine_entry
from sf_trt.export.registry import GRAPHS
from sf_trt.export.trt_config import BuildConfig

from sf_trt.abi import Status, StatusError
from sf_trt.backends.tensorrt import BufferPlan
from sf_trt.formats.manifest import EngineManifest
from sf_trt.formats.shapes import IOTensor, onnx_io


def _entry(tmp_path, name="copy_model", trt="10.13.0", cc="9.0") -> EngineManifest:
    return engine_entry(tmp_path, name, trt, cc)


def test_buffer_plan_of_the_copy_model_from_its_graph():
    cfg = BuildConfig(max_lanes=4, rows_per_lane=64, max_context=128)
    plan = BufferPlan.from_onnx(GRAPHS["copy_model"](), cfg, name="copy_model")
    assert [(b.name, b.mode, b.dtype, b.shape) for b in plan.buffers] == [
        ("history", "input", "int64", (4, 128)),
        ("lanes", "input", "int64", (256,)),
        ("positions", "input", "int64", (256,)),
        ("logits", "output", "float32", (256, 512)),
    ]
    assert plan["logits"].nbytes == 256 * 512 * 4
    assert plan.total_bytes == 4 * 128 * 8 + 2 * 256 * 8 + 256 * 512 * 4
    assert "copy_model: " in plan.describe()


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_buffer_plan_of_every_registry_graph_covers_its_io(name):
    graph = GRAPHS[name]()
    plan = BufferPlan.from_onnx(graph, BuildConfig())
    assert {b.name for b in plan.buffers} == {t.name for t in onnx_io(graph)}
    assert all(b.nbytes > 0 for b in plan.buffers)


def test_buffer_plan_from_a_manifest_matches_the_graph(tmp_path):
    entry = _entry(tmp_path)
    from_manifest = BufferPlan.from_manifest(entry)
    from_graph = BufferPlan.from_onnx(entry.onnx_file, SHAPES, name=entry.name)
    assert from_manifest == from_graph
    assert from_manifest.problems_with([(b.name, b.mode, b.dtype) for b in from_manifest.buffers]) == []
    drift = [("history", "input", "int32"), ("lanes", "input", "int64"), ("logits", "output", "float32"), ("extra", "output", "bool")]
    assert from_manifest.problems_with(drift) == [
        "engine lacks input 'positions'",
        "engine has unplanned output 'extra'",
        "'history' is input int32 in the engine, input int64 in the plan",
    ]


def test_buffer_plan_refuses_an_output_dim_no_input_bounds():
    io = [IOTensor("x", "input", "float32", ("rows",)), IOTensor("y", "output", "float32", ("rows", "mystery"))]
    with pytest.raises(StatusError, match=r"output 'y' dim 1 is named 'mystery', which no input's profile bounds") as err:
        BufferPlan.from_io("g", io, {"rows": 8})
    assert err.value.status == Status.UNSUPPORTED


def test_an_engine_that_takes_more_than_one_shape_is_refused(tmp_path):
    """Every engine takes one shape (min = opt = max): the rows of a pass then never depend on its shape."""
    entry = _entry(tmp_path)
    profile = entry.profiles[0]
    lo, _, hi = profile.inputs["lanes"]
    dynamic = dataclasses.replace(profile, dims={"rows": (1, 8, 8)}, inputs={**profile.inputs, "lanes": ((1,), hi, hi)})
    settings = dataclasses.replace(entry.settings, profiles=(dynamic,))
    with pytest.raises(StatusError, match=r"engine 'copy_model' takes more than one shape \(rows 1\.\.8, input lanes \[1\]\.\.\[8\]\)") as err:
        BufferPlan.from_manifest(dataclasses.replace(entry, settings=settings))
    assert err.value.status == Status.UNSUPPORTED and "Rebuild it with `sf-trt build`" in str(err.value)
    assert profile.unfixed() == [] and dynamic.unfixed() == ["rows 1..8", "input lanes [1]..[8]"]

"""Engine builds (sf_trt.export.trt_build): refusals before TensorRT, and real builds where a GPU is."""

from __future__ import annotations

import importlib.util

import onnx
import pytest
from manifests import write_engines_dir
from onnx import TensorProto as T
from onnx import helper as h
from sf_trt.export.trt_config import BuildConfig, BuildError

from sf_trt.abi import Status, StatusError
from sf_trt.backends.tensorrt import BufferPlan, TensorRTPrimitives
from sf_trt.formats.manifest import check_manifest, read_manifest
from sf_trt.graphs.copy_model import build_copy_graph


def test_without_tensorrt_the_primitives_and_the_build_refuse_clearly(tmp_path):
    if importlib.util.find_spec("tensorrt") is not None:
        pytest.skip("tensorrt is importable here: the refusal path is not reachable")
    engines = write_engines_dir(tmp_path / "engines_in", ("copy_model", "verify"))  # a sound manifest: TensorRT is next
    with pytest.raises(StatusError, match=r"TensorRTPrimitives: TensorRT not available: ") as err:
        TensorRTPrimitives.open(engines)
    assert err.value.status == Status.UNSUPPORTED
    from sf_trt.export.trt_build import build_engine

    graph = tmp_path / "copy_model.onnx"
    onnx.save(build_copy_graph(vocab=16, eos=15, max_lanes=2, max_context=8), graph)
    with pytest.raises(BuildError, match=r"^TensorRT not available: "):
        build_engine(graph, BuildConfig(max_lanes=2, rows_per_lane=4, max_context=8), tmp_path / "engines")
    assert not (tmp_path / "engines").exists()


def test_build_refuses_an_unsupported_graph_before_touching_tensorrt(tmp_path):
    from sf_trt.export.trt_build import build_engine

    x = h.make_tensor_value_info("x", T.INT64, ["rows"])
    y = h.make_tensor_value_info("y", T.INT64, ["rows"])
    bad = h.make_model(
        h.make_graph([h.make_node("BitShift", ["x", "x"], ["y"], name="shift", direction="LEFT")], "g", [x], [y]),
        opset_imports=[h.make_opsetid("", 17)],
    )
    onnx.save(bad, tmp_path / "bad.onnx")
    with pytest.raises(BuildError, match=r"would refuse 1 node\(s\):\n  error: shift \(BitShift\)"):
        build_engine(tmp_path / "bad.onnx", BuildConfig(), tmp_path / "engines")


def _need_tensorrt_and_gpu():
    if importlib.util.find_spec("tensorrt") is None:
        pytest.skip("TensorRT is not installed (pip install tensorrt from NVIDIA's index, on a GPU machine)")
    from sf_trt.backends.tensorrt import TensorRTUnavailable
    from sf_trt.backends.tensorrt.probes import device_info

    try:
        device_info()
    except TensorRTUnavailable as exc:
        pytest.skip(f"no usable CUDA GPU: {exc}")


@pytest.mark.tensorrt
def test_tensorrt_build_writes_an_engine_its_manifest_accepts(tmp_path):
    _need_tensorrt_and_gpu()
    import tensorrt as trt
    from sf_trt.export.trt_build import build_engine

    from sf_trt.backends.tensorrt.probes import device_info

    graph = tmp_path / "copy_model.onnx"
    onnx.save(build_copy_graph(vocab=64, eos=63, max_lanes=4, max_context=64), graph)
    cfg = BuildConfig(max_lanes=4, rows_per_lane=8, max_context=64, timing_cache=str(tmp_path / "timing.cache"))
    entry = build_engine(graph, cfg, tmp_path / "engines", log=lambda s: None)
    assert read_manifest(tmp_path / "engines")["copy_model"] == entry
    check_manifest(entry, trt.__version__, device_info()[0], engine_path=tmp_path / "engines" / entry.engine_file)
    assert (tmp_path / "timing.cache").stat().st_size > 0
    assert BufferPlan.from_manifest(entry) == BufferPlan.from_onnx(graph, cfg, name="copy_model")
    assert entry.settings.builder_flags_cleared == ("TF32",) and entry.precision == "fp32"
    assert entry.settings.builder_flags_set == ("DISTRIBUTIVE_INDEPENDENCE",)  # every supported TensorRT (10.12+) has it


def test_a_decoder_with_a_fixed_cache_is_built_only_at_its_shape(tmp_path, tiny):
    from sf_trt.export.decoder_graph import build_decoder_graph
    from sf_trt.export.trt_build import graph_to_build

    cfg, weights = tiny
    onnx.save(build_decoder_graph(cfg, weights, max_lanes=2, max_context=32), tmp_path / "decoder.onnx")
    with pytest.raises(BuildError, match=r"its KV cache is fixed at 2 lanes x 32 positions; build it with --max-lanes 2 --max-context 32 \(got 8 and 2048\)"):
        graph_to_build(tmp_path / "decoder.onnx", BuildConfig())
    graph = graph_to_build(tmp_path / "decoder.onnx", BuildConfig(max_lanes=2, rows_per_lane=3, max_context=32))
    assert (graph.kind, graph.precision) == ("decoder", "fp32") and graph.profile.max_dims() == {"batch": 2, "rows_per_lane": 3, "logit_rows": 6}


def test_a_verify_variant_whose_inputs_tensorrt_would_drop_is_refused_naming_them(tmp_path):
    from sf_trt.export.trt_build import graph_to_build
    from sf_trt.graphs.verify import build_verify_graph

    onnx.save(build_verify_graph(64, 16, top_k=False), tmp_path / "verify_no_topk.onnx")
    with pytest.raises(BuildError, match=r"would refuse 1 node\(s\):\n  error: top_k: graph input read by no node; TensorRT drops it"):
        graph_to_build(tmp_path / "verify_no_topk.onnx", BuildConfig())


# -- with the stand-in for tensorrt (tests/trt_fakes.py): what the build asks of the bindings ------


def _settings(version: str = "10.13.0.35"):
    from sf_trt.export.trt_config import build_settings
    from sf_trt.formats.shapes import onnx_io

    graph = build_copy_graph(vocab=16, eos=15, max_lanes=2, max_context=8)
    return build_settings("copy_model", "fp32", onnx_io(graph), BuildConfig(max_lanes=2, rows_per_lane=4, max_context=8).limits, version)


@pytest.mark.parametrize("flags, recorded", [
    (("TF32", "DISTRIBUTIVE_INDEPENDENCE"), ("DISTRIBUTIVE_INDEPENDENCE",)),  # 10.12+ and 11.x have it
    (("TF32",), ()),  # bindings without the member: not set, and the manifest's settings say so
])
def test_distributive_independence_is_set_by_name_where_tensorrt_has_it_and_recorded(tmp_path, flags, recorded):
    from trt_fakes import FakeTrt

    from sf_trt.export.trt_build import serialize_engine, settings_for

    trt = FakeTrt(flags=flags)
    settings = settings_for(trt, _settings())
    assert settings.builder_flags_set == recorded
    assert settings.to_json()["builder_flags_set"] == list(recorded)  # what the manifest records
    onnx.save(build_copy_graph(vocab=16, eos=15, max_lanes=2, max_context=8), tmp_path / "copy_model.onnx")
    serialize_engine(trt, tmp_path / "copy_model.onnx", settings)
    assert trt.config.flags == set(recorded) and trt.config.cleared == {"TF32"}
    assert trt.config.pools == {"WORKSPACE": 1 << 30} and len(trt.config.profiles) == 1


def test_a_required_flag_the_bindings_lack_is_refused_naming_it(tmp_path):
    from trt_fakes import FakeTrt

    from sf_trt.export.trt_build import serialize_engine

    onnx.save(build_copy_graph(vocab=16, eos=15, max_lanes=2, max_context=8), tmp_path / "copy_model.onnx")
    with pytest.raises(BuildError, match=r"^TensorRT 10\.13\.0\.35 has no BuilderFlag\.TF32 \(the settings were made for another version\)$"):
        serialize_engine(FakeTrt(flags=("DISTRIBUTIVE_INDEPENDENCE",)), tmp_path / "copy_model.onnx", _settings())


@pytest.mark.parametrize("factory", ["Builder", "Runtime"])
def test_a_tensorrt_that_cannot_start_is_one_line_naming_driver_cuda_and_tensorrt(tmp_path, monkeypatch, factory):
    """trt.Builder / trt.Runtime raise ``TypeError: ... factory function returned nullptr`` when
    libnvinfer cannot reach the driver: one BuildError line with what was found."""
    from trt_fakes import NULLPTR, FakeTrt

    from sf_trt.backends.tensorrt import probes
    from sf_trt.export.trt_build import _engine_io, serialize_engine

    monkeypatch.setattr(probes, "_driver_version", lambda: "535.104.05")
    monkeypatch.setattr(probes, "_driver_cuda", lambda: "12.2")
    monkeypatch.setattr(probes, "_torch_versions", lambda: ("2.9.0", "13.0"))
    monkeypatch.setattr(probes, "_tensorrt_wheel", lambda: "tensorrt-cu13")
    trt = FakeTrt("11.4.0.106", **{f"{factory.lower()}_error": NULLPTR})
    onnx.save(build_copy_graph(vocab=16, eos=15, max_lanes=2, max_context=8), tmp_path / "copy_model.onnx")
    with pytest.raises(BuildError) as err:
        if factory == "Builder":
            serialize_engine(trt, tmp_path / "copy_model.onnx", _settings("11.4.0.106"))
        else:
            _engine_io(trt, trt.Logger(), tmp_path / "x.engine", ())
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"trt.{factory} could not start (TypeError: pybind11::init(): factory function returned nullptr); found ")
    assert "driver 535.104.05 (CUDA 12.2), CUDA runtime 13.0 (torch 2.9.0), TensorRT 11.4.0.106 (tensorrt-cu13)" in line
    assert line.endswith("TensorRT needs CUDA 13 but the driver (535.104.05) supports CUDA 12.2: update the driver")


def test_the_pass_form_decoder_never_reaches_tensorrt(tmp_path, tiny):
    """decoder_pass.onnx takes caches bound per pass at the runtime's key extent: refused before the build, naming the slots form."""
    from sf_trt.export.decoder_graph import build_decoder_graph, pass_form
    from sf_trt.export.trt_build import graph_to_build

    cfg, weights = tiny
    onnx.save(pass_form(build_decoder_graph(cfg, weights)), tmp_path / "decoder_pass.onnx")
    with pytest.raises(BuildError, match=r"decoder_pass.onnx: a decoder graph without a lane_ids input \(the pass form, decoder_pass.onnx, which onnxruntime runs over caches bound per pass\); TensorRT builds the slots form: build decoder.onnx of the same model directory$"):
        graph_to_build(tmp_path / "decoder_pass.onnx", BuildConfig(max_lanes=2, rows_per_lane=3, max_context=32))

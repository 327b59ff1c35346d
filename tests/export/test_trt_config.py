"""What a TensorRT build depends on, and the settings it makes, as data (sf_trt.export.trt_config).

No TensorRT here and no stand-in for it: build_settings is a pure function, so its
values are the test; the manifest records them (round trip in tests/formats/test_manifest.py).
"""

from __future__ import annotations

import json

import pytest
from sf_trt.export.registry import GRAPHS
from sf_trt.export.trt_config import BuildConfig, BuildError, build_settings, graph_kind

from sf_trt.formats.manifest import BuildSettings
from sf_trt.formats.shapes import ShapeLimits, onnx_io

SHAPES = ShapeLimits(max_lanes=4, rows_per_lane=8, max_context=128)


def test_build_config_refuses_bad_values_with_what_it_got():
    with pytest.raises(BuildError, match=r"max_lanes must be an int >= 1 \(got 0\)"):
        BuildConfig(max_lanes=0)
    with pytest.raises(BuildError, match=r"rows_per_lane must be an int >= 1 \(got -1\)"):
        BuildConfig(rows_per_lane=-1)
    with pytest.raises(BuildError, match=r"workspace_bytes must be an int >= 1 \(got 0\)"):
        BuildConfig(workspace_bytes=0)
    assert BuildConfig(max_lanes=3, rows_per_lane=5).limits == ShapeLimits(3, 5, 2048)


@pytest.mark.parametrize("name, kind", [("decoder", "decoder"), ("verify", "verify"), ("copy_model", "copy_model")])
def test_the_kind_of_a_graph_comes_from_its_inputs(name, kind):
    assert graph_kind(onnx_io(GRAPHS[name]())) == kind


@pytest.mark.parametrize("version, network_flags", [
    ("10.12.0", ("STRONGLY_TYPED",)), ("10.13.0.35", ("STRONGLY_TYPED",)),
    ("10.16.1", ("STRONGLY_TYPED",)), ("11.0.0", ()), ("11.4.0.106", ()),
])
@pytest.mark.parametrize("kind, precision", [("decoder", "fp32"), ("decoder", "fp16"), ("decoder", "bf16"), ("verify", "fp32"), ("copy_model", "fp32")])
def test_every_build_is_strongly_typed_with_no_precision_flag_and_no_tf32(version, network_flags, kind, precision):
    """10.x: STRONGLY_TYPED at network creation (weakly typed otherwise); 11.x: always strongly
    typed, the flag deprecated and ignored, so not given. No FP16/BF16 builder flag on any
    version (11 has none): precision is the graph's. TF32 cleared everywhere: fp32 is fp32."""
    io = onnx_io(GRAPHS[kind]())
    s = build_settings(kind, precision, io, SHAPES, version)
    assert (s.kind, s.precision, s.tensorrt_version) == (kind, precision, version)
    assert s.network_flags == network_flags
    assert s.builder_flags_set == ("DISTRIBUTIVE_INDEPENDENCE",)
    assert s.builder_flags_cleared == ("TF32",)
    assert s.memory_pools == (("WORKSPACE", 1 << 30),)
    assert len(s.profiles) == 1 and s.profiles[0].unfixed() == []


def test_the_profile_is_the_one_shape_of_the_graphs_named_dims():
    s = build_settings("decoder", "fp16", onnx_io(GRAPHS["decoder"]()), SHAPES, "10.13.0", workspace_bytes=4 << 30)
    (p,) = s.profiles
    assert p.max_dims() == {"batch": 4, "rows_per_lane": 8, "logit_rows": 32, "max_lanes": 4, "cache_len": 129}
    assert p.inputs["input_ids"] == ((4, 8),) * 3 and p.inputs["past_key_0"][0] == (4, 2, 129, 16)
    assert s.memory_pools == (("WORKSPACE", 4 << 30),)
    verify = build_settings("verify", "fp32", onnx_io(GRAPHS["verify"]()), SHAPES, "10.13.0")
    assert verify.profiles[0].max_dims() == {"rows": 32}  # a decoder run's logit rows, one verify run


def test_settings_are_frozen_values_that_survive_json():
    s = build_settings("decoder", "bf16", onnx_io(GRAPHS["decoder"]()), SHAPES, "11.1.0")
    back = BuildSettings.from_json(json.loads(json.dumps(s.to_json())))
    assert back == s
    with pytest.raises(AttributeError):
        s.precision = "fp32"  # type: ignore[misc]
    d = s.to_json()
    assert d["builder_flags_cleared"] == ["TF32"] and d["network_flags"] == [] and d["memory_pools"] == {"WORKSPACE": 1 << 30}


@pytest.mark.parametrize("args, words", [
    (("verify", "fp16", "10.13.0"), "a verify graph is built from fp32 only (got fp16)"),
    (("copy_model", "bf16", "10.13.0"), "a copy_model graph is built from fp32 only (got bf16)"),
    (("decoder", "fp8", "10.13.0"), "precision 'fp8' unknown (known: fp32, fp16, bf16)"),
    (("encoder", "fp32", "10.13.0"), "graph kind 'encoder' unknown"),
    (("decoder", "fp16", "9.3.0"), "TensorRT 9.3.0 found; sf_trt supports tensorrt>=10.12,<12"),
    (("decoder", "fp16", "10.1.0"), "TensorRT 10.1.0 found; sf_trt supports tensorrt>=10.12,<12"),
    (("decoder", "fp16", "12.0.0"), "TensorRT 12.0.0 found; sf_trt supports tensorrt>=10.12,<12"),
    (("decoder", "fp16", "ten"), "TensorRT version 'ten' is not 'major.minor[.patch...]'"),
])
def test_what_cannot_be_built_is_refused_naming_it(args, words):
    kind, precision, version = args
    io = onnx_io(GRAPHS["decoder" if kind in ("encoder", "decoder") else kind]())
    with pytest.raises(BuildError) as err:
        build_settings(kind, precision, io, SHAPES, version)
    assert words in str(err.value) and "\n" not in str(err.value)

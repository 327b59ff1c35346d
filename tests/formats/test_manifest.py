"""engines/manifest.json (sf_trt.formats.manifest): round trips and refusals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import onnx
import pytest
from sf_trt.export.trt_config import BuildConfig

from sf_trt.formats.files import sha256_file
from sf_trt.formats.manifest import (
    EngineManifest,
    ManifestError,
    check_manifest,
    manifest_problems,
    read_manifest,
    write_manifest,
)
from sf_trt.formats.shapes import derive_profiles, onnx_io
from sf_trt.graphs.copy_model import build_copy_graph


def _entry(tmp_path, name="copy_model", trt="10.3.0", cc="9.0") -> EngineManifest:
    engine = tmp_path / f"{name}.engine"
    engine.write_bytes(b"serialized engine bytes of " + name.encode())
    graph = tmp_path / f"{name}.onnx"
    onnx.save(build_copy_graph(vocab=16, eos=15, max_lanes=2, max_context=8), graph)
    cfg = BuildConfig(max_rows_per_pass=8, max_lanes=2, max_context=8)
    return EngineManifest(
        name=name, engine_file=engine.name, engine_sha256=sha256_file(engine), onnx_file=str(graph),
        onnx_sha256=sha256_file(graph), tensorrt_version=trt, compute_capability=cc, gpu_name="NVIDIA H200",
        precision="fp16", io=tuple(onnx_io(graph)), profiles=(derive_profiles(graph, cfg),),
        build=dataclasses.asdict(cfg), created_utc="2026-12-02T00:00:00+00:00", meta={"eos": "15"},
    )


REFUSALS = {
    "TensorRT version": (dict(trt_version="10.4.0"), "built with TensorRT 10.3.0, running TensorRT 10.4.0"),
    "compute capability": (dict(compute_capability="8.9"), "built for compute capability 9.0 (NVIDIA H200), this GPU is 8.9"),
    "engine digest": (dict(tamper="engine"), "engine file sha256"),
    "engine missing": (dict(tamper="delete"), "is missing"),
    "ONNX changed": (dict(tamper="onnx"), "ONNX graph changed since the build"),
}


def test_manifest_round_trip_keeps_every_engine(tmp_path):
    a, b = _entry(tmp_path, "copy_model"), _entry(tmp_path, "verify")
    write_manifest(tmp_path, a)
    write_manifest(tmp_path, b)  # a second build adds, never drops, the first
    back = read_manifest(tmp_path)
    assert back == {"copy_model": a, "verify": b}
    assert read_manifest(tmp_path / "manifest.json") == back
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["format"] == 1 and data["engines"]["copy_model"]["engine_sha256"] == a.engine_sha256
    check_manifest(back["copy_model"], "10.3.0", (9, 0), engine_path=tmp_path / a.engine_file, onnx_path=a.onnx_file)


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_check_manifest_refuses_what_cannot_run_here(tmp_path, case):
    kw, text = REFUSALS[case]
    entry = _entry(tmp_path)
    engine, graph = tmp_path / entry.engine_file, Path(entry.onnx_file)
    tamper = kw.pop("tamper", None)
    if tamper == "engine":
        engine.write_bytes(b"another engine")
    elif tamper == "delete":
        engine.unlink()
    elif tamper == "onnx":
        onnx.save(build_copy_graph(vocab=17, eos=16, max_lanes=2, max_context=8), graph)
    args = {"trt_version": "10.3.0", "compute_capability": "9.0", **kw}
    with pytest.raises(ManifestError, match=r"refusing engine 'copy_model': ") as err:
        check_manifest(entry, args["trt_version"], args["compute_capability"], engine_path=engine, onnx_path=graph)
    assert text in str(err.value) and "Rebuild it here" in str(err.value)
    others = manifest_problems(entry, args["trt_version"], args["compute_capability"], engine_path=engine, onnx_path=graph)
    assert len(others) == 1, others  # exactly the one thing that is wrong


def test_a_missing_or_malformed_manifest_is_refused_clearly(tmp_path):
    with pytest.raises(ManifestError, match=r"no manifest at .*; build the engines with `sf-trt build` first"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="cannot read manifest"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 99, "engines": {}}))
    with pytest.raises(ManifestError, match="has format 99; expected format 1"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "engines": {"x": {"name": "x"}}}))
    with pytest.raises(ManifestError, match=r"manifest entry 'x' is malformed \(KeyError"):
        read_manifest(tmp_path)

"""engines/manifest.json (sf_trt.formats.manifest): round trips and refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
import pytest
from manifests import engine_entry

from sf_trt.formats.manifest import (
    MANIFEST_FORMAT,
    EngineManifest,
    ManifestError,
    check_manifest,
    manifest_problems,
    read_manifest,
    write_manifest,
)
from sf_trt.graphs.copy_model import build_copy_graph


def _entry(tmp_path, name="copy_model", trt="10.13.0", cc="9.0") -> EngineManifest:
    return engine_entry(tmp_path, name, trt, cc)


REFUSALS = {
    "TensorRT version": (dict(trt_version="10.14.0"), "built with TensorRT 10.13.0, running TensorRT 10.14.0"),
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
    assert data["format"] == 2 and data["engines"]["copy_model"]["engine_sha256"] == a.engine_sha256
    recorded = data["engines"]["copy_model"]["settings"]  # what the build did, as data
    assert recorded["network_flags"] == ["STRONGLY_TYPED"] and recorded["builder_flags_cleared"] == ["TF32"]
    assert recorded["profiles"][0]["dims"] == {"rows": [8, 8, 8]} and back["copy_model"].settings == a.settings
    check_manifest(back["copy_model"], "10.13.0", (9, 0), engine_path=tmp_path / a.engine_file, onnx_path=a.onnx_file)


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
    args = {"trt_version": "10.13.0", "compute_capability": "9.0", **kw}
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
    with pytest.raises(ManifestError, match="has format 99; expected format 2"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 2, "engines": {"x": {"name": "x"}}}))
    with pytest.raises(ManifestError, match=r"manifest entry 'x' is malformed \(KeyError"):
        read_manifest(tmp_path)


@pytest.mark.parametrize("engine_file", ["../../etc/x", "/etc/passwd", "sub/../../x.engine", "C:\\\\x.engine", "..\\\\x.engine", "", 5])
def test_an_engine_file_outside_the_engines_directory_is_refused(tmp_path, engine_file):
    entry = _entry(tmp_path).to_json()
    entry["engine_file"] = engine_file
    (tmp_path / "manifest.json").write_text(json.dumps({"format": MANIFEST_FORMAT, "engines": {"copy_model": entry}}))
    with pytest.raises(ManifestError, match=r"manifest entry 'copy_model': engine_file .* (is not a path inside the engines directory|is not a file name)"):
        read_manifest(tmp_path)


def test_an_engine_file_in_a_subdirectory_is_fine(tmp_path):
    entry = _entry(tmp_path).to_json()
    entry["engine_file"] = "sm90/copy_model.engine"
    (tmp_path / "manifest.json").write_text(json.dumps({"format": MANIFEST_FORMAT, "engines": {"copy_model": entry}}))
    assert read_manifest(tmp_path)["copy_model"].engine_file == "sm90/copy_model.engine"


@pytest.mark.parametrize(
    "data, words",
    [
        (b'{"format": 2, "engines": {"x": [1, 2]}}', "manifest entry is list, expected an object"),
        (b'{"format": 2, "engines": {"x": {"name": "x", "io": 5}}}', "manifest entry 'x' is malformed"),
        (b'{"format": 2, "engines": {"x": "\xff"}}', "cannot read manifest"),
        (b"[" * 100000, "cannot read manifest"),
    ],
)
def test_malformed_manifests_are_refused_in_one_line(tmp_path, data, words):
    (tmp_path / "manifest.json").write_bytes(data)
    with pytest.raises(ManifestError, match=re.escape(words)) as err:
        read_manifest(tmp_path)
    assert "\n" not in str(err.value)


def test_check_engine_file_needs_no_tensorrt(tmp_path):
    from sf_trt.formats.manifest import check_engine_file

    entry = _entry(tmp_path)
    assert check_engine_file(entry, tmp_path) == tmp_path / entry.engine_file
    (tmp_path / entry.engine_file).write_bytes(b"another engine")
    with pytest.raises(ManifestError, match=r"refusing engine 'copy_model': engine file sha256 .* \(damaged or replaced\)"):
        check_engine_file(entry, tmp_path)
    (tmp_path / entry.engine_file).unlink()
    with pytest.raises(ManifestError, match=r"engine file .*copy_model\.engine' is missing"):
        check_engine_file(entry, tmp_path)

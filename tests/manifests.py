"""An engines directory as `sf-trt build` writes it (manifest.json and engine files), for tests without TensorRT.

The engine files hold stand-in bytes; their digests, the graphs they name and
the profiles are real, so everything before TensorRT is looked for is checked
the way it is on a GPU machine.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from sf_trt.export.trt_config import BuildConfig, build_settings

from sf_trt.formats.files import sha256_file
from sf_trt.formats.manifest import EngineManifest, write_manifest
from sf_trt.formats.shapes import onnx_io
from sf_trt.graphs.copy_model import build_copy_graph

SHAPES = BuildConfig(max_lanes=2, rows_per_lane=4, max_context=8)


def engine_entry(directory: Path, name: str = "copy_model", trt: str = "10.13.0", cc: str = "9.0") -> EngineManifest:
    """One engine (stand-in bytes) and its ONNX graph written into ``directory``, and its manifest entry."""
    engine = directory / f"{name}.engine"
    engine.write_bytes(b"serialized engine bytes of " + name.encode())
    graph = directory / f"{name}.onnx"
    onnx.save(build_copy_graph(vocab=16, eos=15, max_lanes=2, max_context=8), graph)
    io = tuple(onnx_io(graph))
    return EngineManifest(
        name=name, engine_file=engine.name, engine_sha256=sha256_file(engine), onnx_file=str(graph),
        onnx_sha256=sha256_file(graph), tensorrt_version=trt, compute_capability=cc, gpu_name="NVIDIA H200",
        io=io, settings=build_settings("copy_model", "fp32", io, SHAPES, trt), created_utc="2026-12-02T00:00:00+00:00",
        meta={"eos": "15"},
    )


def write_engines_dir(directory: Path, names: tuple[str, ...] = ("decoder", "verify")) -> Path:
    """``directory`` with a manifest of ``names`` (what `--backend tensorrt` opens) and their engine files."""
    directory.mkdir(parents=True, exist_ok=True)
    write_manifest(directory, [engine_entry(directory, n) for n in names])
    return directory

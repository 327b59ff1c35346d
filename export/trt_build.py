"""TensorRT engines from ONNX graphs, each recorded in ``manifest.json``.

The build is a chain of small steps, each usable alone:

1. :func:`sf_trt.export.trt_support.check_graph`: refuse what the parser would
   refuse, naming the nodes, before TensorRT is even imported;
2. :func:`sf_trt.formats.shapes.derive_profiles`: one optimization profile from
   the graph's named dynamic dims and the :class:`~.trt_config.BuildConfig`;
3. :func:`build_engine`: network from the ONNX parser, builder config
   (precision, workspace limit, timing cache), the profile, the serialized
   engine, then its manifest entry (:mod:`sf_trt.formats.manifest`), the record
   a runner checks before it deserializes an engine.

Only :func:`build_engine` needs TensorRT (and a GPU); it imports ``tensorrt``
inside the function. Everything else runs, and is tested, on any CPU.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
from pathlib import Path
from typing import Iterable

from sf_trt.backends.tensorrt.probes import device_info, import_tensorrt, trt_dtype_name
from sf_trt.backends.tensorrt.errors import TensorRTUnavailable
from sf_trt.formats.files import sha256_file
from sf_trt.formats.manifest import EngineManifest, write_manifest
from sf_trt.formats.shapes import IOTensor, Profile, ShapeError, derive_profiles, load_graph, onnx_io

from .trt_config import BuildConfig, BuildError, precision_for
from .trt_support import DEFAULT_MAX_OPSET, check_graph, errors_in, format_findings

__all__ = ["build_engine"]


def build_engine(
    onnx_path: str | os.PathLike,
    cfg: BuildConfig,
    out_dir: str | os.PathLike,
    *,
    name: str | None = None,
    plugins: Iterable[str] = (),
    max_opset: int = DEFAULT_MAX_OPSET,
    log=print,
) -> EngineManifest:
    """Build ``onnx_path`` into ``out_dir/<name>.engine`` and record it in
    ``out_dir/manifest.json``; returns the manifest entry.

    Refuses (:class:`BuildError`) before importing TensorRT when the op check
    finds anything the parser would reject; needs TensorRT 10+ and a GPU.
    """
    onnx_path = Path(onnx_path)
    name = name or onnx_path.stem
    try:
        model = load_graph(onnx_path)
        found = errors_in(check_graph(model, max_opset=max_opset, plugins=plugins))
        if found:
            raise BuildError(f"{onnx_path}: TensorRT's ONNX parser would refuse {len(found)} node(s):\n{format_findings(found)}")
        profile = derive_profiles(model, cfg)
        io = onnx_io(model)
    except ShapeError as exc:
        raise BuildError(str(exc)) from None
    meta = {p.key: p.value for p in model.metadata_props}
    del model
    cfg = cfg.with_precision(precision_for(name, cfg))
    try:
        trt = import_tensorrt()
        cc, gpu_name = device_info()
    except TensorRTUnavailable as exc:
        raise BuildError(str(exc)) from None

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    if not builder:
        raise BuildError("trt.Builder could not be created (is a GPU visible to TensorRT?)")
    network, parser = _parse(trt, builder, logger, onnx_path)  # the parser owns the weights: keep it alive
    config = _builder_config(trt, builder, cfg, profile)
    log(f"building {name} ({cfg.precision}) from {onnx_path} ...")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BuildError(f"{onnx_path}: build_serialized_network failed (see TensorRT's log above)")
    del parser
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    engine_path = out / f"{name}.engine"
    engine_path.write_bytes(memoryview(serialized))
    if cfg.timing_cache:
        cache_path = Path(cfg.timing_cache)
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_bytes(memoryview(config.get_timing_cache().serialize()))
    entry = EngineManifest(
        name=name,
        engine_file=engine_path.name,
        engine_sha256=sha256_file(engine_path),
        onnx_file=os.fspath(onnx_path.resolve()),
        onnx_sha256=sha256_file(onnx_path),
        tensorrt_version=str(trt.__version__),
        compute_capability=cc,
        gpu_name=gpu_name,
        precision=cfg.precision,
        io=_engine_io(trt, logger, engine_path, io),
        profiles=(profile,),
        build={f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)},
        created_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        meta=meta,
    )
    write_manifest(out, entry)
    log(f"  wrote {engine_path} ({engine_path.stat().st_size} bytes)")
    return entry


def _parse(trt, builder, logger, onnx_path: Path):
    """``(network, parser)`` TensorRT's ONNX parser makes of ``onnx_path``; BuildError listing its errors.
    The parser owns the weights the network points into: keep it until the build is done."""
    # TensorRT 10: networks are always explicit-batch; flags 0 = weakly typed,
    # so the precision flags let TensorRT choose fp16/bf16 kernels.
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(os.fspath(onnx_path)):
        errs = []
        for i in range(parser.num_errors):
            e = parser.get_error(i)
            node = e.node_name() if hasattr(e, "node_name") else e.node()
            op = e.node_operator() if hasattr(e, "node_operator") else ""
            errs.append(f"  node {node} ({op}): {e.desc()}")
        raise BuildError(f"{onnx_path}: TensorRT's ONNX parser refused it:\n" + "\n".join(errs))
    return network, parser


def _builder_config(trt, builder, cfg: BuildConfig, profile: Profile):
    """The builder config: workspace, precision flags, timing cache, the one profile."""
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, cfg.workspace_bytes)
    if cfg.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif cfg.precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
    if cfg.timing_cache:
        cache_path = Path(cfg.timing_cache)
        cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
        if not config.set_timing_cache(cache, False):  # ignore_mismatch=False
            raise BuildError(f"timing cache {os.fspath(cache_path)!r} was rejected (built by another TensorRT or GPU?); delete it")
    trt_profile = builder.create_optimization_profile()
    for input_name, (lo, mid, hi) in profile.inputs.items():
        trt_profile.set_shape(input_name, lo, mid, hi)
    if config.add_optimization_profile(trt_profile) < 0:
        raise BuildError(f"TensorRT refused the optimization profile {profile.to_json()['inputs']}")
    return config


def _engine_io(trt, logger, engine_path: Path, io: list[IOTensor]) -> tuple[IOTensor, ...]:
    """The engine's I/O as TensorRT sees it (names, dtypes), shapes with the graph's dim names."""
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_path.read_bytes())
    if engine is None:
        raise BuildError(f"{engine_path}: the engine just built does not deserialize")
    onnx_shapes = {t.name: t.shape for t in io}
    out = []
    for i in range(engine.num_io_tensors):
        tname = engine.get_tensor_name(i)
        mode = "input" if engine.get_tensor_mode(tname) == trt.TensorIOMode.INPUT else "output"
        shape = onnx_shapes.get(tname) or tuple(int(d) for d in engine.get_tensor_shape(tname))
        out.append(IOTensor(tname, mode, trt_dtype_name(trt, engine.get_tensor_dtype(tname)), tuple(shape)))
    return tuple(out)

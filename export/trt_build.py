"""TensorRT engines from ONNX graphs, each recorded in ``manifest.json``.

The build is a chain of small steps, each usable alone:

1. :func:`sf_trt.export.trt_support.check_graph`: refuse what the parser would
   refuse, naming the nodes, before TensorRT is even imported;
2. :func:`sf_trt.export.trt_config.build_settings`: the settings as data (network
   and builder flags by name, memory pools, the one fixed profile) from the
   graph's kind and precision, the shapes and this TensorRT's version;
3. :func:`build_engine`: network from the ONNX parser, builder config, serialized
   engine, all as the settings say (this module decides nothing), then the manifest
   entry (:mod:`sf_trt.formats.manifest`) a runner checks before it deserializes.

Only :func:`build_engine` needs TensorRT (and a GPU); it imports ``tensorrt``
inside the function. Everything else runs, and is tested, on any CPU. Every
``RuntimeError`` TensorRT raises becomes a :class:`~.trt_config.BuildError` naming
the step and the tensor.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
from pathlib import Path
from typing import Iterable

from sf_trt.backends.tensorrt.errors import TensorRTUnavailable
from sf_trt.backends.tensorrt.probes import device_info, import_tensorrt, start_tensorrt, trt_dtype_name
from sf_trt.formats.files import sha256_file
from sf_trt.formats.manifest import BuildSettings, EngineManifest, write_manifest
from sf_trt.formats.model_dir import GRAPH_FILE, PASS_GRAPH_FILE, graph_precision
from sf_trt.formats.shapes import IOTensor, Profile, ShapeError, load_graph, onnx_io, profile_of

from .trt_config import OPTIONAL_FLAGS, BuildConfig, BuildError, build_settings, graph_kind
from .trt_support import DEFAULT_MAX_OPSET, check_graph, errors_in, format_findings

__all__ = ["GraphToBuild", "graph_to_build", "build_engine", "serialize_engine", "settings_for"]


@dataclasses.dataclass(frozen=True)
class GraphToBuild:
    """A graph checked for a build: what :func:`~.trt_config.build_settings` needs from it,
    and the engine's one shape."""

    path: Path
    kind: str
    precision: str
    io: tuple[IOTensor, ...]
    profile: Profile
    meta: dict[str, str]


def graph_to_build(
    onnx_path: str | os.PathLike, cfg: BuildConfig, *, plugins: Iterable[str] = (), max_opset: int = DEFAULT_MAX_OPSET,
) -> GraphToBuild:
    """Everything before TensorRT: the op check, the graph's kind, precision and I/O, its
    fixed profile under ``cfg``'s shapes. :class:`BuildError` when the parser would refuse a
    node or a dim has no shape."""
    onnx_path = Path(onnx_path)
    try:
        model = load_graph(onnx_path)
        _refuse_pass_form(onnx_path, model)
        found = errors_in(check_graph(model, max_opset=max_opset, plugins=plugins))
        if found:
            raise BuildError(f"{onnx_path}: TensorRT's ONNX parser would refuse {len(found)} node(s):\n{format_findings(found)}")
        io = tuple(onnx_io(model))
        graph = GraphToBuild(
            onnx_path, graph_kind(io), graph_precision(model), io, profile_of(io, cfg.limits),
            {p.key: p.value for p in model.metadata_props},
        )
    except (ShapeError, ValueError) as exc:
        raise BuildError(f"{onnx_path}: {exc}") from None
    if graph.kind == "decoder":
        _check_decoder_cache(graph, cfg)
    return graph


def _refuse_pass_form(onnx_path: Path, model) -> None:
    """A decoder without ``lane_ids`` is the pass form (``decoder_pass.onnx``), onnxruntime's: it
    takes the pass's lanes' caches at a key extent the runtime picks per pass. A TensorRT engine
    has one shape and binds its caches once, whole: the slots form (``decoder.onnx``)."""
    names = {i.name for i in model.graph.input}
    if "past_key_0" in names and "lane_ids" not in names:
        raise BuildError(
            f"{onnx_path}: a decoder graph without a lane_ids input (the pass form, {PASS_GRAPH_FILE}, which onnxruntime "
            f"runs over caches bound per pass); TensorRT builds the slots form: build {GRAPH_FILE} of the same model directory"
        )


def _check_decoder_cache(graph: GraphToBuild, cfg: BuildConfig) -> None:
    """A decoder whose KV cache the graph fixes must be built with those lanes and that
    context: every run takes every lane slot (the runtime refuses anything else)."""
    cache = next(t for t in graph.io if t.name == "past_key_0")
    lanes, _, slots, _ = cache.shape
    want = (lanes if isinstance(lanes, int) else cfg.max_lanes, slots - 1 if isinstance(slots, int) else cfg.max_context)
    if want != (cfg.max_lanes, cfg.max_context):
        raise BuildError(
            f"{graph.path}: its KV cache is fixed at {want[0]} lanes x {want[1]} positions; build it with "
            f"--max-lanes {want[0]} --max-context {want[1]} (got {cfg.max_lanes} and {cfg.max_context})"
        )


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
    finds anything the parser would reject; needs a supported TensorRT and a GPU.
    """
    onnx_path = Path(onnx_path)
    name = name or onnx_path.stem
    graph = graph_to_build(onnx_path, cfg, plugins=plugins, max_opset=max_opset)  # refused before TensorRT is looked for
    try:
        trt = import_tensorrt()
        cc, gpu_name = device_info()
    except TensorRTUnavailable as exc:
        raise BuildError(str(exc)) from None
    settings = settings_for(trt, build_settings(graph.kind, graph.precision, graph.io, cfg.limits, trt.__version__, workspace_bytes=cfg.workspace_bytes))
    log(f"building {name} ({settings.kind}, {settings.precision}, shapes {dict(settings.profiles[0].max_dims())}) from {onnx_path} ...")
    serialized = serialize_engine(trt, onnx_path, settings, timing_cache=cfg.timing_cache)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    engine_path = out / f"{name}.engine"
    engine_path.write_bytes(serialized)
    logger = trt.Logger(trt.Logger.WARNING)
    entry = EngineManifest(
        name=name,
        engine_file=engine_path.name,
        engine_sha256=sha256_file(engine_path),
        onnx_file=os.fspath(onnx_path.resolve()),
        onnx_sha256=sha256_file(onnx_path),
        tensorrt_version=str(trt.__version__),
        compute_capability=cc,
        gpu_name=gpu_name,
        io=_engine_io(trt, logger, engine_path, graph.io),
        settings=settings,
        created_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        meta=graph.meta,
    )
    write_manifest(out, entry)
    log(f"  wrote {engine_path} ({engine_path.stat().st_size} bytes)")
    return entry


def settings_for(trt, settings: BuildSettings) -> BuildSettings:
    """``settings`` as this TensorRT can apply them: an optional flag
    (:data:`~.trt_config.OPTIONAL_FLAGS`) its ``trt.BuilderFlag`` lacks is left out, so
    the manifest (which records the settings) says whether it was set."""
    have = [f for f in settings.builder_flags_set if f not in OPTIONAL_FLAGS or getattr(trt.BuilderFlag, f, None) is not None]
    return dataclasses.replace(settings, builder_flags_set=tuple(have))


def serialize_engine(trt, onnx_path: str | os.PathLike, settings: BuildSettings, *, timing_cache: str | None = None) -> bytes:
    """The engine TensorRT builds from the ONNX file at ``onnx_path`` exactly as ``settings``
    say, serialized; the timing cache (if given) read before and written after. Runs no check
    of its own: :func:`build_engine` checks the graph first."""
    onnx_path = Path(onnx_path)
    logger = trt.Logger(trt.Logger.WARNING)
    try:
        builder = start_tensorrt(trt, "Builder", logger)
    except TensorRTUnavailable as exc:
        raise BuildError(str(exc)) from None
    network, parser = _parse(trt, builder, logger, onnx_path, settings)  # the parser owns the weights: keep it alive
    config = _builder_config(trt, builder, settings, timing_cache)
    serialized = _call(lambda: builder.build_serialized_network(network, config), f"{onnx_path}: build_serialized_network")
    if serialized is None:
        raise BuildError(f"{onnx_path}: build_serialized_network failed (see TensorRT's log above)")
    del parser
    if timing_cache:
        cache_path = Path(timing_cache)
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_bytes(memoryview(config.get_timing_cache().serialize()))
    return bytes(memoryview(serialized))


def _call(fn, what: str):
    """``fn()``, a ``RuntimeError`` from TensorRT's bindings becoming a BuildError naming ``what``."""
    try:
        return fn()
    except RuntimeError as exc:
        raise BuildError(f"{what} raised: {exc}") from None


def _enum(trt, enum: str, name: str):
    """``trt.<enum>.<name>``, or a BuildError saying this TensorRT has no such member."""
    member = getattr(getattr(trt, enum), name, None)
    if member is None:
        raise BuildError(f"TensorRT {trt.__version__} has no {enum}.{name} (the settings were made for another version)")
    return member


def _parse(trt, builder, logger, onnx_path: Path, settings: BuildSettings):
    """``(network, parser)`` TensorRT's ONNX parser makes of ``onnx_path``, on a network
    created with the settings' flags; BuildError listing the parser's errors. The parser
    owns the weights the network points into: keep it until the build is done."""
    flags = 0
    for flag in settings.network_flags:
        flags |= 1 << int(_enum(trt, "NetworkDefinitionCreationFlag", flag))
    network = _call(lambda: builder.create_network(flags), f"create_network({' | '.join(settings.network_flags) or '0'})")
    parser = trt.OnnxParser(network, logger)
    if not _call(lambda: parser.parse_from_file(os.fspath(onnx_path)), f"{onnx_path}: parse_from_file"):
        errs = []
        for i in range(parser.num_errors):
            e = parser.get_error(i)
            node = e.node_name() if hasattr(e, "node_name") else e.node()
            op = e.node_operator() if hasattr(e, "node_operator") else ""
            errs.append(f"  node {node} ({op}): {e.desc()}")
        raise BuildError(f"{onnx_path}: TensorRT's ONNX parser refused it:\n" + "\n".join(errs))
    return network, parser


def _builder_config(trt, builder, settings: BuildSettings, timing_cache: str | None):
    """The builder config as the settings say: memory pools, flags set and cleared, the profile;
    and the timing cache."""
    config = builder.create_builder_config()
    for pool, size in settings.memory_pools:
        _call(lambda: config.set_memory_pool_limit(_enum(trt, "MemoryPoolType", pool), size), f"set_memory_pool_limit({pool}, {size})")
    for flag in settings.builder_flags_set:
        config.set_flag(_enum(trt, "BuilderFlag", flag))
    for flag in settings.builder_flags_cleared:
        config.clear_flag(_enum(trt, "BuilderFlag", flag))
    if timing_cache:
        cache_path = Path(timing_cache)
        cache = _call(lambda: config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b""), "create_timing_cache")
        if not config.set_timing_cache(cache, False):  # ignore_mismatch=False
            raise BuildError(f"timing cache {os.fspath(cache_path)!r} was rejected (built by another TensorRT or GPU?); delete it")
    for profile in settings.profiles:
        trt_profile = builder.create_optimization_profile()
        for input_name, (lo, mid, hi) in profile.inputs.items():
            _call(lambda: trt_profile.set_shape(input_name, lo, mid, hi), f"optimization profile set_shape({input_name!r}, {list(lo)}, {list(mid)}, {list(hi)})")
        if config.add_optimization_profile(trt_profile) < 0:
            raise BuildError(f"TensorRT refused the optimization profile {profile.to_json()['inputs']}")
    return config


def _engine_io(trt, logger, engine_path: Path, io: tuple[IOTensor, ...]) -> tuple[IOTensor, ...]:
    """The engine's I/O as TensorRT sees it (names, dtypes), shapes with the graph's dim names."""
    try:
        runtime = start_tensorrt(trt, "Runtime", logger)
    except TensorRTUnavailable as exc:
        raise BuildError(str(exc)) from None
    engine = _call(lambda: runtime.deserialize_cuda_engine(engine_path.read_bytes()), f"{engine_path}: deserialize_cuda_engine")
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

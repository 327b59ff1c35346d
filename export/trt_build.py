"""TensorRT engines from ONNX graphs, each recorded in ``manifest.json``.

The build is a chain of small steps, each usable alone:

1. :func:`export.trt_support.check_graph`: refuse what the parser would refuse,
   naming the nodes, before TensorRT is even imported;
2. :func:`derive_profiles`: one optimization profile from the graph's named
   dynamic dims (``rows``, ``lanes``, ``context``, ... see :data:`DIM_ROLES`)
   and one :class:`BuildConfig`;
3. :func:`build_engine`: builder, network from the ONNX parser, builder config
   (precision, workspace limit, timing cache), the profile, the serialized
   engine, then its manifest entry;
4. :func:`write_manifest` / :func:`read_manifest` / :func:`check_manifest`: the
   record a runner checks before it deserializes an engine (same TensorRT
   version, same GPU compute capability, same bytes).

Only :func:`build_engine` needs TensorRT (and a GPU); it imports ``tensorrt``
inside the function. Everything else runs, and is tested, on any CPU.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import onnx

from .trt_support import DEFAULT_MAX_OPSET, check_graph, errors_in, format_findings

__all__ = [
    "BuildError",
    "ManifestError",
    "BuildConfig",
    "DIM_ROLES",
    "ROLE_LIMITS",
    "FIXED_ROLES",
    "Profile",
    "IOTensor",
    "EngineManifest",
    "EXACT_GRAPHS",
    "MANIFEST_NAME",
    "derive_profiles",
    "onnx_io",
    "precision_for",
    "build_engine",
    "write_manifest",
    "read_manifest",
    "check_manifest",
    "manifest_problems",
    "sha256_file",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
PRECISIONS = ("fp32", "fp16", "bf16")

EXACT_GRAPHS = frozenset({"verify"})
"""Graphs built in fp32 whatever ``--precision`` says: the verify-and-sample
graph decides tokens (top-p cumulative sums, Gumbel argmax), and reduced
precision there changes which token wins; it is cheap next to the decoder."""


class BuildError(Exception):
    """A build step refused its input; the message says what it got and expected."""


class ManifestError(BuildError):
    """A manifest is missing, malformed, or does not match this TensorRT, GPU or engine."""


# -- configuration ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Everything a build depends on besides the graph.

    ``max_rows_per_pass``, ``max_lanes``, ``max_context`` bound the profile's
    dims by role (:data:`DIM_ROLES`); the ``opt_*`` points are the shapes
    TensorRT tunes kernels for (defaults: rows = lanes = ``max_lanes``, one
    decode row per lane; context = ``max_context``).
    """

    precision: str = "fp16"
    workspace_bytes: int = 1 << 30
    timing_cache: str | None = None
    max_rows_per_pass: int = 256
    max_lanes: int = 8
    max_context: int = 2048
    opt_rows_per_pass: int | None = None
    opt_lanes: int | None = None
    opt_context: int | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise BuildError(f"BuildConfig: precision {self.precision!r}, expected one of {list(PRECISIONS)}")
        for name in ("workspace_bytes", "max_rows_per_pass", "max_lanes", "max_context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BuildError(f"BuildConfig: {name} must be an int >= 1 (got {value!r})")
        for role in ROLE_LIMITS:
            opt, top = getattr(self, f"opt_{role}"), getattr(self, f"max_{role}")
            if opt is not None and (isinstance(opt, bool) or not isinstance(opt, int) or not 1 <= opt <= top):
                raise BuildError(f"BuildConfig: opt_{role} must be an int in 1..max_{role}={top} (got {opt!r})")

    def limits(self, role: str) -> tuple[int, int, int]:
        """``(min, opt, max)`` of a dim with this role."""
        if role in FIXED_ROLES:  # a state buffer's size: allocated once, never varies
            n = FIXED_ROLES[role](self)
            return n, n, n
        top = getattr(self, f"max_{role}")
        opt = getattr(self, f"opt_{role}")
        if opt is None:
            opt = min(self.max_lanes, top) if role == "rows_per_pass" else top
        return 1, opt, top

    def with_precision(self, precision: str) -> "BuildConfig":
        return dataclasses.replace(self, precision=precision)


# The one table from a graph's dim names to what bounds them. Graph authors:
# name a dynamic dim with one of these; a dim named otherwise is refused by
# derive_profiles. In use: export/copy_model.py and export/verify.py "rows";
# export/decoder.py "batch", "rows" (rows per lane), "logit_rows", and, when
# exported with symbolic caches, "max_lanes" and "cache_len" (= max_context + 1).
DIM_ROLES: dict[str, str] = {
    # rows of one forward pass (the decoder: rows per lane), and the logit rows it returns
    "rows": "rows_per_pass", "R": "rows_per_pass", "num_rows": "rows_per_pass",
    "logit_rows": "rows_per_pass", "K": "rows_per_pass",
    # lanes in a pass
    "lanes": "lanes", "B": "lanes", "batch": "lanes", "num_lanes": "lanes",
    # positions of a lane's state
    "context": "context", "T": "context", "ctx": "context", "past": "context", "kv_len": "context",
    # the state's own size (fixed: min = opt = max)
    "max_lanes": "lane_slots", "cache_len": "cache_len",
}
ROLE_LIMITS = ("rows_per_pass", "lanes", "context")
"""Roles bounded by ``BuildConfig.max_<role>`` (min 1)."""
FIXED_ROLES = {
    "lane_slots": lambda cfg: cfg.max_lanes,
    "cache_len": lambda cfg: cfg.max_context + 1,  # one trash slot past the last position
}
"""Roles of state-buffer dims: exactly this size in every profile."""


# -- graph I/O and profiles ----------------------------------------------------------


_ONNX_DTYPE = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.DOUBLE: "float64",
}


@dataclasses.dataclass(frozen=True)
class IOTensor:
    """One engine input or output: ``shape`` holds ints for static dims and
    the graph's dim names (str) for dynamic ones; ``dtype`` is a numpy name
    (``"bfloat16"`` for BF16)."""

    name: str
    mode: str  # "input" | "output"
    dtype: str
    shape: tuple[int | str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "IOTensor":
        return IOTensor(str(d["name"]), str(d["mode"]), str(d["dtype"]), tuple(d["shape"]))


def _load(graph: onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    if isinstance(graph, onnx.ModelProto):
        return graph
    try:
        return onnx.load(os.fspath(graph), load_external_data=False)
    except Exception as exc:
        raise BuildError(f"cannot load {os.fspath(graph)!r} as ONNX ({type(exc).__name__}: {exc})") from None


def onnx_io(graph: onnx.ModelProto | str | os.PathLike) -> list[IOTensor]:
    """The graph's runtime inputs (initializers excluded) and outputs."""
    model = _load(graph)
    inits = {t.name for t in model.graph.initializer}
    out: list[IOTensor] = []
    for mode, vis in (("input", [v for v in model.graph.input if v.name not in inits]), ("output", model.graph.output)):
        for vi in vis:
            tt = vi.type.tensor_type
            if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
                raise BuildError(f"graph {mode} {vi.name!r} has no tensor shape; expected a typed, ranked tensor")
            dtype = _ONNX_DTYPE.get(tt.elem_type)
            if dtype is None:
                raise BuildError(
                    f"graph {mode} {vi.name!r} of type {onnx.TensorProto.DataType.Name(tt.elem_type)}; "
                    f"expected one of {sorted(set(_ONNX_DTYPE.values()))}"
                )
            dims: list[int | str] = []
            for k, d in enumerate(tt.shape.dim):
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.dim_param:
                    dims.append(d.dim_param)
                else:
                    raise BuildError(f"graph {mode} {vi.name!r} dim {k} is dynamic but unnamed; expected a name from DIM_ROLES")
            out.append(IOTensor(vi.name, mode, dtype, tuple(dims)))
    return out


@dataclasses.dataclass(frozen=True)
class Profile:
    """One optimization profile.

    ``dims``: dim name -> ``(min, opt, max)``; ``inputs``: each input with a
    dynamic dim -> ``(min_shape, opt_shape, max_shape)``; ``static``: inputs
    whose shape is fixed.
    """

    dims: dict[str, tuple[int, int, int]]
    inputs: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    static: dict[str, tuple[int, ...]]

    def max_dims(self) -> dict[str, int]:
        return {name: rng[2] for name, rng in self.dims.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "dims": {k: list(v) for k, v in self.dims.items()},
            "inputs": {k: {"min": list(a), "opt": list(b), "max": list(c)} for k, (a, b, c) in self.inputs.items()},
            "static": {k: list(v) for k, v in self.static.items()},
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Profile":
        return Profile(
            {k: tuple(int(x) for x in v) for k, v in d["dims"].items()},
            {k: (tuple(v["min"]), tuple(v["opt"]), tuple(v["max"])) for k, v in d["inputs"].items()},
            {k: tuple(v) for k, v in d.get("static", {}).items()},
        )


def derive_profiles(graph: onnx.ModelProto | str | os.PathLike, cfg: BuildConfig) -> Profile:
    """The optimization profile of ``graph`` under ``cfg``.

    Each dynamic dim of each input is named; its name's role in
    :data:`DIM_ROLES` gives its ``(min, opt, max)`` from ``cfg``. Raises
    :class:`BuildError` naming the input and dim when a name has no role.
    """
    dims: dict[str, tuple[int, int, int]] = {}
    inputs: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {}
    static: dict[str, tuple[int, ...]] = {}
    for t in onnx_io(graph):
        if t.mode != "input":
            continue
        if all(isinstance(d, int) for d in t.shape):
            static[t.name] = tuple(int(d) for d in t.shape)
            continue
        lo, mid, hi = [], [], []
        for k, d in enumerate(t.shape):
            if isinstance(d, int):
                rng = (d, d, d)
            else:
                role = DIM_ROLES.get(d)
                if role is None:
                    known = ", ".join(f"{r}: {sorted(n for n, rr in DIM_ROLES.items() if rr == r)}" for r in (*ROLE_LIMITS, *FIXED_ROLES))
                    raise BuildError(
                        f"derive_profiles: input {t.name!r} dim {k} is named {d!r}, which has no role; "
                        f"expected one of the names in DIM_ROLES ({known})"
                    )
                rng = dims.setdefault(d, cfg.limits(role))
            lo.append(rng[0])
            mid.append(rng[1])
            hi.append(rng[2])
        inputs[t.name] = (tuple(lo), tuple(mid), tuple(hi))
    return Profile(dims, inputs, static)


def precision_for(name: str, cfg: BuildConfig) -> str:
    """The precision graph ``name`` is built in (fp32 for :data:`EXACT_GRAPHS`)."""
    return "fp32" if name in EXACT_GRAPHS else cfg.precision


# -- manifests ------------------------------------------------------------------------


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _cc_str(cc: str | tuple[int, int] | list[int]) -> str:
    if isinstance(cc, str):
        parts = cc.split(".")
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            return cc
        raise ManifestError(f"compute capability {cc!r}; expected 'major.minor', e.g. '9.0'")
    major, minor = cc
    return f"{int(major)}.{int(minor)}"


@dataclasses.dataclass(frozen=True)
class EngineManifest:
    """What was built, from what, with what, for which GPU.

    ``io`` are the engine's tensors (shapes with the graph's dim names),
    ``profiles`` its optimization profiles (one today), ``build`` the
    :class:`BuildConfig` fields it was built with.
    """

    name: str
    engine_file: str
    engine_sha256: str
    onnx_file: str
    onnx_sha256: str
    tensorrt_version: str
    compute_capability: str
    gpu_name: str
    precision: str
    io: tuple[IOTensor, ...]
    profiles: tuple[Profile, ...]
    build: dict[str, Any]
    created_utc: str = ""
    meta: dict[str, str] = dataclasses.field(default_factory=dict)
    """The graph's ``metadata_props`` (builders record e.g. vocab, eos, top_k_limit there)."""

    def inputs(self) -> list[IOTensor]:
        return [t for t in self.io if t.mode == "input"]

    def outputs(self) -> list[IOTensor]:
        return [t for t in self.io if t.mode == "output"]

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["io"] = [t.to_json() for t in self.io]
        d["profiles"] = [p.to_json() for p in self.profiles]
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "EngineManifest":
        try:
            return EngineManifest(
                name=str(d["name"]),
                engine_file=str(d["engine_file"]),
                engine_sha256=str(d["engine_sha256"]),
                onnx_file=str(d["onnx_file"]),
                onnx_sha256=str(d["onnx_sha256"]),
                tensorrt_version=str(d["tensorrt_version"]),
                compute_capability=_cc_str(d["compute_capability"]),
                gpu_name=str(d.get("gpu_name", "")),
                precision=str(d["precision"]),
                io=tuple(IOTensor.from_json(t) for t in d["io"]),
                profiles=tuple(Profile.from_json(p) for p in d["profiles"]),
                build=dict(d.get("build", {})),
                created_utc=str(d.get("created_utc", "")),
                meta={str(k): str(v) for k, v in d.get("meta", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"manifest entry {d.get('name', '?')!r} is malformed ({type(exc).__name__}: {exc})") from None


def _manifest_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / MANIFEST_NAME if p.is_dir() or not p.suffix else p


def read_manifest(path: str | os.PathLike) -> dict[str, EngineManifest]:
    """The engines recorded in ``path`` (a ``manifest.json`` or the directory holding one)."""
    p = _manifest_path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ManifestError(f"no manifest at {os.fspath(p)!r}; build the engines with `sf-trt build` first") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"cannot read manifest {os.fspath(p)!r} ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT or not isinstance(data.get("engines"), dict):
        raise ManifestError(
            f"manifest {os.fspath(p)!r} has format {data.get('format') if isinstance(data, dict) else None!r}; "
            f"expected format {MANIFEST_FORMAT} with an 'engines' table"
        )
    return {name: EngineManifest.from_json(entry) for name, entry in data["engines"].items()}


def write_manifest(out_dir: str | os.PathLike, entries: EngineManifest | Iterable[EngineManifest]) -> Path:
    """Record ``entries`` in ``out_dir/manifest.json``, keeping the other engines there."""
    if isinstance(entries, EngineManifest):
        entries = [entries]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MANIFEST_NAME
    table = {n: m.to_json() for n, m in read_manifest(path).items()} if path.exists() else {}
    for m in entries:
        table[m.name] = m.to_json()
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"format": MANIFEST_FORMAT, "engines": table}, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def manifest_problems(
    manifest: EngineManifest,
    trt_version: str,
    compute_capability: str | tuple[int, int],
    *,
    engine_path: str | os.PathLike | None = None,
    onnx_path: str | os.PathLike | None = None,
) -> list[str]:
    """Every reason ``manifest``'s engine cannot run here (empty: it can)."""
    problems = []
    # A serialized engine runs only on the TensorRT version that built it (no
    # version-compatible flag is set), and only on the GPU architecture it was
    # built for (no hardware-compatibility level is set).
    if manifest.tensorrt_version != str(trt_version):
        problems.append(f"built with TensorRT {manifest.tensorrt_version}, running TensorRT {trt_version}")
    cc = _cc_str(compute_capability)
    if manifest.compute_capability != cc:
        problems.append(
            f"built for compute capability {manifest.compute_capability} ({manifest.gpu_name or 'unknown GPU'}), "
            f"this GPU is {cc}"
        )
    if engine_path is not None:
        if not Path(engine_path).is_file():
            problems.append(f"engine file {os.fspath(engine_path)!r} is missing")
        else:
            digest = sha256_file(engine_path)
            if digest != manifest.engine_sha256:
                problems.append(f"engine file sha256 {digest[:16]}..., manifest says {manifest.engine_sha256[:16]}...")
    if onnx_path is not None and Path(onnx_path).is_file():
        digest = sha256_file(onnx_path)
        if digest != manifest.onnx_sha256:
            problems.append(f"ONNX graph changed since the build (sha256 {digest[:16]}..., built from {manifest.onnx_sha256[:16]}...)")
    return problems


def check_manifest(
    manifest: EngineManifest,
    trt_version: str,
    compute_capability: str | tuple[int, int],
    *,
    engine_path: str | os.PathLike | None = None,
    onnx_path: str | os.PathLike | None = None,
) -> None:
    """Raise :class:`ManifestError` listing every reason the engine cannot run here."""
    problems = manifest_problems(manifest, trt_version, compute_capability, engine_path=engine_path, onnx_path=onnx_path)
    if problems:
        raise ManifestError(
            f"refusing engine {manifest.name!r}: " + "; ".join(problems) + ". Rebuild it here with `sf-trt build`."
        )


# -- the TensorRT build ---------------------------------------------------------------


def import_tensorrt():
    """``tensorrt``, or :class:`BuildError` saying why it cannot be used."""
    try:
        import tensorrt as trt  # noqa: PLC0415 (lazy by design: only builds and runs need it)
    except Exception as exc:  # ImportError, or a broken install raising OSError on libnvinfer
        raise BuildError(f"TensorRT not available: {type(exc).__name__}: {exc}") from None
    major = int(str(getattr(trt, "__version__", "0")).split(".")[0] or 0)
    if major < 10:
        raise BuildError(f"TensorRT {getattr(trt, '__version__', '?')} found; expected 10 or newer")
    return trt


def device_info(device: int = 0) -> tuple[str, str]:
    """``(compute capability 'major.minor', GPU name)`` of CUDA device ``device``.

    Tries torch, then cuda-python; :class:`BuildError` when neither sees a GPU.
    """
    errors = []
    try:
        import torch  # noqa: PLC0415

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device)
            return f"{major}.{minor}", torch.cuda.get_device_name(device)
        errors.append("torch: no CUDA device")
    except ImportError as exc:
        errors.append(f"torch: {exc}")
    try:
        cudart = _cudart()
        err, prop = cudart.cudaGetDeviceProperties(device)
        if int(err) == 0:
            name = prop.name.decode(errors="replace") if isinstance(prop.name, bytes) else str(prop.name)
            return f"{prop.major}.{prop.minor}", name.rstrip("\x00")
        errors.append(f"cuda-python: cudaGetDeviceProperties returned {err}")
    except ImportError as exc:
        errors.append(f"cuda-python: {exc}")
    raise BuildError("no CUDA GPU visible (" + "; ".join(errors) + ")")


def _cudart():
    try:
        from cuda.bindings import runtime as cudart  # noqa: PLC0415  (cuda-python >= 12.6)
    except ImportError:
        from cuda import cudart  # noqa: PLC0415  (older cuda-python)
    return cudart


def trt_dtype_name(trt, dtype) -> str:
    names = {
        "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
        "INT8": "int8", "UINT8": "uint8", "BOOL": "bool", "FP8": "float8_e4m3fn", "INT4": "int4",
    }
    for key, value in names.items():
        if getattr(trt.DataType, key, None) == dtype:
            return value
    raise BuildError(f"engine tensor of TensorRT type {dtype}; expected one of {sorted(names)}")


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
    model = _load(onnx_path)
    found = errors_in(check_graph(model, max_opset=max_opset, plugins=plugins))
    if found:
        raise BuildError(f"{onnx_path}: TensorRT's ONNX parser would refuse {len(found)} node(s):\n{format_findings(found)}")
    profile = derive_profiles(model, cfg)
    io = onnx_io(model)
    meta = {p.key: p.value for p in model.metadata_props}
    del model
    cfg = cfg.with_precision(precision_for(name, cfg))

    trt = import_tensorrt()
    cc, gpu_name = device_info()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    if not builder:
        raise BuildError("trt.Builder could not be created (is a GPU visible to TensorRT?)")
    # TensorRT 10: networks are always explicit-batch; flags 0 = weakly typed,
    # so the precision flags below let TensorRT choose fp16/bf16 kernels.
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

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, cfg.workspace_bytes)
    if cfg.precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif cfg.precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
    cache_path = Path(cfg.timing_cache) if cfg.timing_cache else None
    if cache_path is not None:
        cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
        if not config.set_timing_cache(cache, False):  # ignore_mismatch=False
            raise BuildError(f"timing cache {os.fspath(cache_path)!r} was rejected (built by another TensorRT or GPU?); delete it")

    trt_profile = builder.create_optimization_profile()
    for input_name, (lo, mid, hi) in profile.inputs.items():
        trt_profile.set_shape(input_name, lo, mid, hi)
    if config.add_optimization_profile(trt_profile) < 0:
        raise BuildError(f"TensorRT refused the optimization profile {profile.to_json()['inputs']}")

    log(f"building {name} ({cfg.precision}) from {onnx_path} ...")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BuildError(f"{onnx_path}: build_serialized_network failed (see TensorRT's log above)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    engine_path = out / f"{name}.engine"
    with open(engine_path, "wb") as f:
        f.write(memoryview(serialized))
    if cache_path is not None:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_bytes(memoryview(config.get_timing_cache().serialize()))

    # Read the I/O back from the engine itself: names and dtypes as TensorRT sees them.
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_path.read_bytes())
    if engine is None:
        raise BuildError(f"{engine_path}: the engine just built does not deserialize")
    onnx_shapes = {t.name: t.shape for t in io}
    engine_io = []
    for i in range(engine.num_io_tensors):
        tname = engine.get_tensor_name(i)
        mode = "input" if engine.get_tensor_mode(tname) == trt.TensorIOMode.INPUT else "output"
        shape = onnx_shapes.get(tname) or tuple(int(d) for d in engine.get_tensor_shape(tname))
        engine_io.append(IOTensor(tname, mode, trt_dtype_name(trt, engine.get_tensor_dtype(tname)), tuple(shape)))
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
        io=tuple(engine_io),
        profiles=(profile,),
        build={f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)},
        created_utc=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        meta=meta,
    )
    write_manifest(out, entry)
    log(f"  wrote {engine_path} ({engine_path.stat().st_size} bytes)")
    return entry

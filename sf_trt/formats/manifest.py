"""``engines/manifest.json``: what was built, from what, with what, for which GPU.

``sf-trt build`` writes one entry per engine (:func:`write_manifest`), with the
:class:`BuildSettings` it was built with (network and builder flags by name, memory
pools, the fixed profile); the TensorRT backend reads them (:func:`read_manifest`)
and refuses an engine built by another TensorRT version, for another GPU, or whose
bytes changed (:func:`check_manifest`), or whose profile is not fixed, before it
deserializes anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Iterable, Mapping

from .files import sha256_file
from .shapes import IOTensor, Profile

__all__ = [
    "MANIFEST_NAME", "MANIFEST_FORMAT", "ManifestError", "BuildSettings", "EngineManifest",
    "read_manifest", "write_manifest", "manifest_problems", "check_manifest", "check_engine_file",
]

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 2
"""2: entries record their :class:`BuildSettings` (strongly typed builds, fixed profiles)."""


class ManifestError(ValueError):
    """A manifest is missing, malformed, or does not match this TensorRT, GPU or engine."""


def _cc_str(cc: str | tuple[int, int] | list[int]) -> str:
    if isinstance(cc, str):
        parts = cc.split(".")
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            return cc
        raise ManifestError(f"compute capability {cc!r}; expected 'major.minor', e.g. '9.0'")
    major, minor = cc
    return f"{int(major)}.{int(minor)}"


@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """How one engine is built, as data: what ``sf_trt.export.trt_config.build_settings``
    decides from the graph's kind and precision, the shapes and the TensorRT version,
    and all that ``sf_trt.export.trt_build`` applies (every flag by its enum *name*:
    TensorRT renumbered them between 10 and 11).

    ``network_flags``: ``NetworkDefinitionCreationFlag`` names; ``builder_flags_set`` /
    ``builder_flags_cleared``: ``BuilderFlag`` names; ``memory_pools``: ``(MemoryPoolType
    name, bytes)``; ``profiles``: the optimization profiles (one, fixed).
    """

    kind: str
    precision: str
    tensorrt_version: str
    network_flags: tuple[str, ...]
    builder_flags_set: tuple[str, ...]
    builder_flags_cleared: tuple[str, ...]
    memory_pools: tuple[tuple[str, int], ...]
    profiles: tuple[Profile, ...]

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["memory_pools"] = {name: size for name, size in self.memory_pools}
        d["profiles"] = [p.to_json() for p in self.profiles]
        for key in ("network_flags", "builder_flags_set", "builder_flags_cleared"):
            d[key] = list(d[key])
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "BuildSettings":
        names = lambda key: tuple(str(n) for n in d[key])  # noqa: E731
        return BuildSettings(
            kind=str(d["kind"]), precision=str(d["precision"]), tensorrt_version=str(d["tensorrt_version"]),
            network_flags=names("network_flags"), builder_flags_set=names("builder_flags_set"),
            builder_flags_cleared=names("builder_flags_cleared"),
            memory_pools=tuple((str(k), int(v)) for k, v in d["memory_pools"].items()),
            profiles=tuple(Profile.from_json(p) for p in d["profiles"]),
        )


@dataclasses.dataclass(frozen=True)
class EngineManifest:
    """What was built, from what, with what, for which GPU.

    ``io`` are the engine's tensors (shapes with the graph's dim names),
    ``settings`` what it was built with (:class:`BuildSettings`: flags, memory,
    its one fixed profile, the precision of its graph).
    """

    name: str
    engine_file: str
    engine_sha256: str
    onnx_file: str
    onnx_sha256: str
    tensorrt_version: str
    compute_capability: str
    gpu_name: str
    io: tuple[IOTensor, ...]
    settings: BuildSettings
    created_utc: str = ""
    meta: dict[str, str] = dataclasses.field(default_factory=dict)
    """The graph's ``metadata_props`` (builders record e.g. vocab, eos, top_k_limit there)."""

    @property
    def precision(self) -> str:
        return self.settings.precision

    @property
    def profiles(self) -> tuple[Profile, ...]:
        return self.settings.profiles

    def inputs(self) -> list[IOTensor]:
        return [t for t in self.io if t.mode == "input"]

    def outputs(self) -> list[IOTensor]:
        return [t for t in self.io if t.mode == "output"]

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["io"] = [t.to_json() for t in self.io]
        d["settings"] = self.settings.to_json()
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "EngineManifest":
        if not isinstance(d, Mapping):
            raise ManifestError(f"manifest entry is {type(d).__name__}, expected an object")
        try:
            return EngineManifest(
                name=str(d["name"]),
                engine_file=_engine_file(d["engine_file"]),
                engine_sha256=str(d["engine_sha256"]),
                onnx_file=str(d["onnx_file"]),
                onnx_sha256=str(d["onnx_sha256"]),
                tensorrt_version=str(d["tensorrt_version"]),
                compute_capability=_cc_str(d["compute_capability"]),
                gpu_name=str(d.get("gpu_name", "")),
                io=tuple(IOTensor.from_json(t) for t in d["io"]),
                settings=BuildSettings.from_json(d["settings"]),
                created_utc=str(d.get("created_utc", "")),
                meta={str(k): str(v) for k, v in d.get("meta", {}).items()},
            )
        except ManifestError as exc:
            raise ManifestError(f"manifest entry {d.get('name', '?')!r}: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, RecursionError) as exc:
            raise ManifestError(f"manifest entry {d.get('name', '?')!r} is malformed ({type(exc).__name__}: {exc})") from None


def _engine_file(value: Any) -> str:
    """An ``engine_file``: a relative path that stays inside the engines directory."""
    if not isinstance(value, str) or not value:
        raise ManifestError(f"engine_file {value!r} is not a file name")
    parts = PurePosixPath(value.replace("\\", "/")).parts
    if value.startswith(("/", "\\")) or PureWindowsPath(value).drive or ".." in parts or "\0" in value:
        raise ManifestError(f"engine_file {value!r} is not a path inside the engines directory")
    return value


def _manifest_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / MANIFEST_NAME if p.is_dir() or not p.suffix else p


def read_manifest(path: str | os.PathLike) -> dict[str, EngineManifest]:
    """The engines recorded in ``path`` (a ``manifest.json`` or the directory holding one)."""
    p = _manifest_path(path)
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"no manifest at {os.fspath(p)!r}; build the engines with `sf-trt build` first") from None
    except (OSError, ValueError, RecursionError) as exc:
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


def check_engine_file(manifest: EngineManifest, engine_dir: str | os.PathLike) -> Path:
    """The path of ``manifest``'s engine inside ``engine_dir``, after checking it
    is there with the recorded sha256 (no TensorRT needed: run this first)."""
    path = Path(engine_dir) / manifest.engine_file
    if not path.is_file():
        raise ManifestError(f"refusing engine {manifest.name!r}: engine file {os.fspath(path)!r} is missing. Rebuild it with `sf-trt build`.")
    digest = sha256_file(path)
    if digest != manifest.engine_sha256:
        raise ManifestError(
            f"refusing engine {manifest.name!r}: engine file sha256 {digest[:16]}..., manifest says "
            f"{manifest.engine_sha256[:16]}... (damaged or replaced). Rebuild it with `sf-trt build`."
        )
    return path


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

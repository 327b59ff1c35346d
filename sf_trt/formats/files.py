"""Files sf_trt writes and reads back: digests, temporaries, replacement, signals.

* **Digests** are sha256, computed one way (:func:`sha256_file`). A file's digest
  is remembered in a stamps file beside it (:class:`DigestStamps`,
  :data:`STAMPS_NAME`) together with the file's size, ``mtime_ns``, ``ctime_ns``,
  inode and device: while all five are unchanged the file is not read again;
  any write, copy, replacement or ``touch`` changes one of them and the file is
  hashed again. A stamp is only kept for a file left alone for
  :data:`QUIET_NS` (a write in the same clock tick as the hash could otherwise
  go unseen), and only where the directory is writable (elsewhere every check
  hashes).
* **Temporaries** are named ``.<target>.sf_trt-<kind>-<pid>-<random>`` beside
  their target (:func:`temp_path`), so a later run recognises those left by a
  process that no longer exists (killed with SIGKILL, or a power cut) and
  removes them (:func:`sweep_stale`).
* **Replacement** of a directory is a rename: the new one is written beside it,
  the old one renamed aside, the new one renamed in, the old one removed
  (:func:`replace_dir`): a reader finds the old directory or the new one, never
  a mixture.
* **Signals**: :func:`removed_on_signal` turns SIGTERM and SIGHUP into
  :class:`Terminated` for the duration of a write, so the ``finally`` that
  removes a temporary runs (SIGINT already raises ``KeyboardInterrupt``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

__all__ = [
    "sha256_file", "STAMPS_NAME", "QUIET_NS", "DigestStamps", "temp_path", "sweep_stale", "remove", "replace_dir",
    "removed_on_signal", "Terminated", "check_writable_dir", "NotWritable",
]

STAMPS_NAME = ".sf_trt-verified.json"
"""The stamps file of a directory: ``{file name: {"sha256", "size", "mtime_ns", "ctime_ns", "ino", "dev"}}``."""
QUIET_NS = 2_000_000_000
"""A file changed less than this long ago is hashed every time (no stamp is kept)."""
_STAT_KEYS = ("size", "mtime_ns", "ctime_ns", "ino", "dev")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """The sha256 hex digest of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _stat_facts(path: Path) -> dict[str, int]:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino, "dev": st.st_dev}


class DigestStamps:
    """The digests of the files of one directory, remembered with their stat facts.

    ``sha256(name)`` is the remembered digest while the file's stat facts are
    the ones it was hashed under, else the file is hashed (and the digest kept,
    once :meth:`save` writes the stamps). A stamps file that is unreadable or
    malformed counts as empty: it only ever saves work, never decides a check.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.path = self.directory / STAMPS_NAME
        self._table: dict[str, dict] = {}
        self._changed = False
        try:
            table = json.loads(self.path.read_text())
            if isinstance(table, dict):
                self._table = {k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, dict)}
        except (OSError, ValueError):
            pass

    def sha256(self, name: str) -> str:
        """The sha256 of file ``name`` of the directory (OSError if it cannot be read)."""
        path = self.directory / name
        facts = _stat_facts(path)
        known = self._table.get(name)
        if known is not None and all(known.get(k) == facts[k] for k in _STAT_KEYS) and isinstance(known.get("sha256"), str):
            return known["sha256"]
        digest = sha256_file(path)
        quiet = time.time_ns() - max(facts["mtime_ns"], facts["ctime_ns"]) > QUIET_NS
        if quiet and _stat_facts(path) == facts:
            self._table[name] = {"sha256": digest, **facts}
            self._changed = True
        elif self._table.pop(name, None) is not None:
            self._changed = True
        return digest

    def forget(self, name: str) -> None:
        if self._table.pop(name, None) is not None:
            self._changed = True

    def save(self) -> None:
        """Write the stamps (atomically), if anything changed and the directory is writable."""
        if not self._changed:
            return
        tmp = temp_path(self.path, "tmp")
        try:
            tmp.write_text(json.dumps(self._table, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.path)
            self._changed = False
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()


# -- temporaries -----------------------------------------------------------------------

_TEMP = re.compile(r"^\.(?P<target>.+)\.sf_trt-(?P<kind>[a-z]+)-(?P<pid>\d+)-[0-9a-f]+$")


def temp_path(target: str | os.PathLike, kind: str = "tmp") -> Path:
    """A fresh name beside ``target`` for a temporary of this process (``kind``: a
    lowercase word, e.g. ``tmp`` or ``old``); nothing is created."""
    target = Path(target)
    return target.parent / f".{target.name}.sf_trt-{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_stale(target: str | os.PathLike) -> list[Path]:
    """Remove the temporaries beside ``target`` left by processes that no longer
    exist; the paths removed."""
    target = Path(target)
    removed = []
    try:
        siblings = list(target.parent.iterdir())
    except OSError:
        return removed
    for p in siblings:
        m = _TEMP.match(p.name)
        if m is None or m["target"] != target.name or _alive(int(m["pid"])):
            continue
        try:
            remove(p)
            removed.append(p)
        except OSError:
            pass
    return removed


def remove(path: Path) -> None:
    """Remove a file, link or directory tree at ``path``; nothing there is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def replace_dir(new: Path, out: Path) -> None:
    """Rename directory ``new`` to ``out``; whatever is at ``out`` is renamed
    aside first and removed after (put back if the rename in fails)."""
    if not (out.exists() or out.is_symlink()):
        os.rename(new, out)
        return
    aside = temp_path(out, "old")
    os.rename(out, aside)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(aside, out)
        raise
    remove(aside)


# -- signals ------------------------------------------------------------------------------


class Terminated(SystemExit):
    """SIGTERM or SIGHUP arrived during a write; ``code`` is 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"terminated by {signal.Signals(self.signum).name}"


def _raise_terminated(signum, _frame):
    raise Terminated(signum)


@contextlib.contextmanager
def removed_on_signal(*paths: Path) -> Iterator[None]:
    """Remove ``paths`` (files or directories) if the block raises, SIGTERM and
    SIGHUP included (they raise :class:`Terminated` while the block runs, where
    their action is the default one and this is the main thread)."""
    installed = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                installed[sig] = signal.signal(sig, _raise_terminated)
    try:
        yield
    except BaseException:
        for p in paths:
            with contextlib.suppress(OSError):
                remove(p)
        raise
    finally:
        for sig, old in installed.items():
            signal.signal(sig, old)


# -- writable directories -------------------------------------------------------------------


class NotWritable(OSError):
    """A directory sf_trt must write into cannot be created or written."""


def check_writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Create directory ``path`` if needed and check a file can be made in it;
    :class:`NotWritable` naming ``what`` it is for and the reason."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotWritable(f"{path}: is a file, not a directory; cannot write the {what} there")
    probe = temp_path(path / "probe", "probe")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if exc.filename is not None and Path(exc.filename) not in (path, probe):
            reason += f": {exc.filename}"
        raise NotWritable(f"{path}: cannot write the {what} there ({reason})") from None
    return path

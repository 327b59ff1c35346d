"""File digests, computed one way everywhere."""

from __future__ import annotations

import hashlib
import os

__all__ = ["sha256_file"]


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """The sha256 hex digest of the file at ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()

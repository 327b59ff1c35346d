"""Running ``sf-trt`` as a user does, in a child process: for the command-line tests."""

from __future__ import annotations

import os
import subprocess
import sys


def sf_trt(*args: str, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m sf_trt.cli ARGS``; never a traceback; ``check``: exit 0; ``env`` adds variables."""
    proc = subprocess.run([sys.executable, "-m", "sf_trt.cli", *args], capture_output=True, text=True, timeout=600,
                          env=None if env is None else {**os.environ, **env})
    assert "Traceback" not in proc.stderr, proc.stderr
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def refused(*args: str, code: int = 1) -> str:
    """The one line a refused command prints last, after checking its exit code."""
    proc = sf_trt(*args)
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    return proc.stderr.strip().splitlines()[-1]

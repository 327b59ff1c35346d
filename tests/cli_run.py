"""Running ``sf-trt`` as a user does, in a child process: for the command-line tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx

from servers import wait_for


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(*flags: str, fake: bool = True, timeout_s: float = 60, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """``sf-trt serve`` as a process on a free port (the fake backend unless ``fake=False``), once healthy;
    ``env`` adds variables."""
    port = free_port()
    backend = ["--backend", "fake"] if fake else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "sf_trt.cli", "serve", *backend, "--port", str(port), "--log-level", "warning", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stdout.read()
        try:
            return httpx.get(f"{url}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(up, timeout_s)
    return proc, url

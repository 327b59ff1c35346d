"""uvicorn for ``sf-trt serve``: time limits on slow clients, and a drain that answers 503.

* :class:`TimedH11Protocol`: uvicorn's h11 protocol with a **read timeout**: a
  connection must send a complete request head (request line and headers) within
  ``read_timeout_s`` of opening, or of the end of its previous response plus the
  keep-alive timeout; else it is closed. uvicorn itself never closes a connection
  that trickles a header byte at a time (a slow-loris). Heads are bounded by h11
  (:data:`~sf_trt.serve.limits.MAX_HEAD_BYTES`); idle keep-alive connections close after
  ``timeout_keep_alive``; a body must arrive within the read timeout too
  (:func:`sf_trt.serve.guard.read_body`).
* :class:`DrainingServer`: on the first SIGTERM (or Ctrl+C) it keeps listening while
  the engine drains: new requests get a 503 (and ``/health`` says so), queued ones end
  at once, running ones finish within the drain timeout; once the engine is idle the
  server closes its sockets and stops. A second signal stops it at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import DEFAULT_KEEP_ALIVE_S, DEFAULT_READ_TIMEOUT_S, MAX_HEAD_BYTES

__all__ = ["TimedH11Protocol", "DrainingServer", "uvicorn_config"]



class TimedH11Protocol(H11Protocol):
    """h11 with a deadline for each request head (module docstring). The deadline is
    ``config.read_timeout_s`` (set by :func:`uvicorn_config`)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.read_timeout_s: float = getattr(config, "read_timeout_s", DEFAULT_READ_TIMEOUT_S)
        self._head_timer: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.read_timeout_s)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is in: the route's read timeout takes over
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm(self.timeout_keep_alive + self.read_timeout_s)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, delay_s: float) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(delay_s, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, draining the engine of ``state`` before it stops listening
    (module docstring)."""

    def __init__(self, config: uvicorn.Config, state: Any) -> None:
        super().__init__(config)
        self.state = state
        self._draining: Optional[threading.Thread] = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        engine = self.state.engine
        if self._draining is not None or engine is None:  # a second signal, or nothing to drain
            super().handle_exit(sig, frame)
            return
        self._captured_signals.append(sig)  # uvicorn re-raises what it caught once it has stopped
        engine.drain(self.state.drain_timeout_s)
        self._draining = threading.Thread(target=self._exit_when_idle, name="sf_trt-drain", daemon=True)
        self._draining.start()

    def _exit_when_idle(self) -> None:
        engine = self.state.engine
        deadline = time.monotonic() + self.state.drain_timeout_s + 5.0
        while (engine.num_running or engine.num_waiting) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.should_exit = True

    async def shutdown(self, sockets: Any = None) -> None:
        if self.state.engine is not None:
            self.state.engine.drain(self.state.drain_timeout_s)
        await super().shutdown(sockets)


def uvicorn_config(app: Any, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "info",
                   read_timeout_s: float = DEFAULT_READ_TIMEOUT_S, keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
                   graceful_s: float = 35.0) -> uvicorn.Config:
    """The uvicorn configuration ``sf-trt serve`` runs with (and the tests)."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, lifespan="on", http=TimedH11Protocol,
        timeout_keep_alive=keep_alive_s, timeout_graceful_shutdown=graceful_s,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    )
    config.read_timeout_s = read_timeout_s
    return config

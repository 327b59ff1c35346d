"""Live servers for the serve tests (fixtures in tests/serve/conftest.py): a real uvicorn on 127.0.0.1, on a port the OS
picks, in a thread of the test process, stopped (and checked stopped) after use."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from typing import Any, Callable, Iterator, Optional

import httpx

from sf_trt.engine_loop import EngineLoop, LoopConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.serve.app import create_app
from sf_trt.serve.metrics import ServerMetrics
from sf_trt.serve.state import ServerState
from sf_trt.tokenizer import ByteTokenizer

from fakes import POISON, FaultyFake, SlowFake  # noqa: F401 - re-exported for the serve tests

FAKE = FakeConfig(vocab=257, eos=256, copy_model=True, copy_miss_every=6, verify_rows=True, max_lanes=8, max_context=1024, top_k_limit=64)
TOK = ByteTokenizer(257, 256)
@dataclasses.dataclass
class Live:
    url: str
    state: ServerState
    server: Any

    @property
    def engine(self) -> EngineLoop:
        return self.state.engine

    def metric(self, name: str, **labels: str) -> float:
        """A sample of /metrics (summed over label sets that match ``labels``)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name)] in " {" and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


@contextlib.contextmanager
def live_server(
    primitives: Any = None,
    *,
    tokenizer: Any = TOK,
    config: LoopConfig = LoopConfig(),
    api_key: Optional[str] = None,
    model_name: str = "fake",
    max_context: Optional[int] = None,
    loader: Optional[Callable] = None,
    speculate: str = "prompt-lookup",
    **limits: Any,
) -> Iterator[Live]:
    """A uvicorn server over an engine loop on ``primitives`` (the fake by default), configured
    as ``sf-trt serve`` configures it (:func:`sf_trt.serve.server.uvicorn_config`); ``limits``:
    more :class:`ServerState` fields (``max_body_bytes``, ``read_timeout_s`` ...), and
    ``keep_alive_s``."""
    from sf_trt.serve.server import DrainingServer, uvicorn_config

    keep_alive_s = limits.pop("keep_alive_s", 5.0)

    state = ServerState(model_name=model_name, metrics=ServerMetrics(model_name), api_key=api_key,
                        default_speculate=speculate, drain_timeout_s=5.0, **limits)
    if loader is None:
        prims = primitives if primitives is not None else FakePrimitives(FAKE)
        state.engine = EngineLoop(prims, tokenizer=tokenizer, config=config, observer=state.metrics)
        state.tokenizer, state.max_context = tokenizer, max_context or prims.capabilities.max_context
    app = create_app(state, loader)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = DrainingServer(uvicorn_config(app, log_level="warning", read_timeout_s=state.read_timeout_s,
                                           keep_alive_s=keep_alive_s, graceful_s=10), state)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield Live(f"http://127.0.0.1:{port}", state, server)
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        assert not thread.is_alive(), "the test server did not stop"
        if state.engine is not None:
            assert state.engine.executor.lanes == [], "lanes left behind"


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)

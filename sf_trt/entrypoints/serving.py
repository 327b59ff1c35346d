"""What ``sf-trt serve`` serves (:class:`ServeConfig`), and building it: the backend, the
routes' state and the engine loop over them.

The single-process server and every Ray Serve replica build their server from one
:class:`ServeConfig` (the command line makes it from its flags; a replica receives
it, never the flags).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from ..abi import Status, StatusError
from ..backends import BackendSpec
from ..engine_loop import EngineLoop, LoopConfig
from ..scheduler import DEFAULT_DRAFTER
from ..serve.limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROMPT_BYTES, DEFAULT_READ_TIMEOUT_S
from .model import DEFAULT_CONTEXT, ModelSpec, resolve

__all__ = ["ServeConfig", "FAKE_BACKEND", "open_served", "server_state"]

log = logging.getLogger("sf_trt.serve")

FAKE_BACKEND = "fake"
"""The backend name of the copy-model fake with a byte tokenizer (tests and demos, no model)."""
FAKE_VOCAB, FAKE_EOS = 257, 256


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """Everything a server needs to load its model and serve.

    ``model`` / ``backend``: what to open (``backend.name == FAKE_BACKEND``: the fake,
    each pass taking ``fake_pass_ms`` more); ``max_num_seqs``: lanes; ``max_context``:
    positions per lane (None: 2048); ``served_model_name``: the id clients send (None:
    the model's name, ``fake`` for the fake); ``api_key``: the Bearer token /v1 routes
    require (None: none); ``speculate`` / ``max_draft``: the defaults of requests that
    do not say; ``drain_timeout_s``: how long running requests may take at shut-down;
    ``loop``: the engine loop's queue and scheduler (the serving profile);
    ``max_body_bytes`` / ``max_prompt_bytes`` / ``read_timeout_s``: the routes' limits on
    a request (a 413 before the body is read; a 400 before the prompt is tokenized; the
    seconds a body may take to arrive).
    """

    model: ModelSpec = ModelSpec()
    backend: BackendSpec = BackendSpec()
    max_num_seqs: int = 8
    max_context: Optional[int] = None
    served_model_name: Optional[str] = None
    api_key: Optional[str] = None
    speculate: str = DEFAULT_DRAFTER
    max_draft: int = 8
    drain_timeout_s: float = 30.0
    fake_pass_ms: float = 0.0
    loop: LoopConfig = LoopConfig()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.fake_pass_ms and self.backend.name != FAKE_BACKEND:
            raise StatusError(Status.BAD_ARGUMENT, f"ServeConfig: fake_pass_ms slows the fake backend only (got backend {self.backend.name!r})")

    @property
    def context(self) -> int:
        return self.max_context or DEFAULT_CONTEXT

    @property
    def model_name(self) -> str:
        """The model id clients send."""
        if self.served_model_name:
            return self.served_model_name
        return FAKE_BACKEND if self.backend.name == FAKE_BACKEND else self.model.name


def open_served(config: ServeConfig) -> tuple[Any, Any, int]:
    """``(primitives, tokenizer, max_context)`` for ``config``."""
    if config.backend.name == FAKE_BACKEND:
        from ..backends.fake import FakeConfig, FakePrimitives
        from ..tokenizer import ByteTokenizer

        n = config.max_num_seqs
        cfg = FakeConfig(vocab=FAKE_VOCAB, eos=FAKE_EOS, copy_model=True, verify_rows=True, max_lanes=n, max_context=config.context,
                         max_rows_per_pass=max(1024, n), top_k_limit=64, pass_delay_s=config.fake_pass_ms / 1000)
        return FakePrimitives(cfg), ByteTokenizer(FAKE_VOCAB, FAKE_EOS), config.context
    model = resolve(config.model, progress=False)
    prims = config.backend.open(model.model_dir.path, max_lanes=config.max_num_seqs, max_context=config.context)
    return prims, model.tokenizer, config.context


def server_state(config: ServeConfig, *, const_labels: Optional[dict[str, str]] = None):
    """``(state, loader)`` for ``config``: the routes' shared state, and what builds the engine
    loop (``const_labels``: labels on every metric, e.g. the Ray replica's)."""
    from ..serve.metrics import ServerMetrics
    from ..serve.state import ServerState

    name = config.model_name
    state = ServerState(
        model_name=name, metrics=ServerMetrics(name, const_labels), api_key=config.api_key, default_speculate=config.speculate,
        default_max_draft=config.max_draft, drain_timeout_s=config.drain_timeout_s, max_body_bytes=config.max_body_bytes,
        max_prompt_bytes=config.max_prompt_bytes, read_timeout_s=config.read_timeout_s,
    )

    def loader():
        prims, tokenizer, max_context = open_served(config)
        caps = prims.capabilities
        if config.speculate != "none" and not (caps.verify_rows and caps.truncate_partial):
            state.default_speculate = "none"
        loop = config.loop
        prefix_cache_mb = loop.executor.prefix_cache_mb
        if prefix_cache_mb and not caps.state_bytes_per_token:
            log.warning("no prefix cache: %s cannot save or load its state (--prefix-cache-mb %d ignored)", type(prims).__name__, prefix_cache_mb)
            loop = dataclasses.replace(loop, executor=dataclasses.replace(loop.executor, prefix_cache_mb=0))
        return EngineLoop(prims, tokenizer=tokenizer, config=loop, observer=state.metrics), tokenizer, max_context

    return state, loader

"""What the routes share: :class:`ServerState`, and the :data:`Loader` that builds the
engine loop when the model loads in the background."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Awaitable, Callable, Optional

from ..engine_loop import EngineLoop
from ..scheduler import DEFAULT_DRAFTER
from .errors import ApiError
from .limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROMPT_BYTES, DEFAULT_READ_TIMEOUT_S
from .metrics import ServerMetrics

__all__ = ["ServerState", "Loader"]


@dataclasses.dataclass
class ServerState:
    """What the routes share. ``engine``/``tokenizer``/``max_context`` are set once the model
    has loaded (``/health`` answers 503 until then)."""

    model_name: str
    metrics: ServerMetrics
    api_key: Optional[str] = None
    default_speculate: str = DEFAULT_DRAFTER
    default_max_draft: int = 0
    drain_timeout_s: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    engine: Optional[EngineLoop] = None
    tokenizer: Any = None
    max_context: int = 0
    load_error: Optional[str] = None
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    metrics_view: Optional[Callable[[], Awaitable[bytes]]] = None
    """What ``/metrics`` answers when set (a deployment's metrics, not this server's alone)."""

    def ready_engine(self) -> EngineLoop:
        if self.load_error is not None:
            raise ApiError(503, "ServiceUnavailableError", f"the model failed to load: {self.load_error}")
        if self.engine is None:
            raise ApiError(503, "ServiceUnavailableError", "the model is loading; try again shortly")
        return self.engine


Loader = Callable[[], tuple[EngineLoop, Any, int]]
"""Builds ``(engine loop, tokenizer, max_context)``; the app starts the loop."""

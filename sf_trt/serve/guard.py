"""What every HTTP request passes before a route reads a byte of its body.

:class:`Guard` is a plain ASGI middleware around the app. In this order, from the
request's headers alone:

1. **The API key** (``--api-key``): every path but :data:`OPEN_PATHS` needs
   ``Authorization: Bearer KEY``; without it a 401, whatever the body (a 50 MB body
   is never read). ``/docs`` and ``/openapi.json`` are behind the key too.
2. **The body's size** (``--max-body-bytes``): a ``Content-Length`` above the limit is
   a 413 before the body is read; a body sent without one (chunked) is counted as it
   is read (:func:`read_body`) and refused once it passes the limit.
3. **The body's type**: a request with a body must be ``application/json`` (or
   ``+json``); another ``Content-Type`` (curl's ``-d`` sends a form's) is a 415 that
   does not echo the body. A body with no ``Content-Type`` is read as JSON.
4. **Draining**: once the engine stops admitting (SIGTERM), a request to a route
   that generates is a 503 at once.

Each early answer is OpenAI's envelope and closes the connection (its body is never
read). Bodies are then parsed by the routes off the event loop (:func:`parse_body`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any, Awaitable, Callable, Optional, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import ApiError, validation_error

__all__ = ["Guard", "OPEN_PATHS", "GENERATING_PATHS", "read_body", "parse_body"]

OPEN_PATHS = frozenset({"/health", "/metrics", "/version"})
"""Paths that need no API key (probes and scrapers carry none)."""
GENERATING_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
"""Paths refused with a 503 while the server drains."""
_JSON = "application/json"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
M = TypeVar("M", bound=BaseModel)


class Guard:
    """The ASGI middleware (module docstring) over ``app``; ``state`` is the
    :class:`~sf_trt.serve.state.ServerState`, read per request (``api_key``,
    ``max_body_bytes``, ``engine``)."""

    def __init__(self, app: Any, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self.check(scope)
            if error is not None:
                await _send_error(send, error)
                return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> Optional[ApiError]:
        """The error for a request with these headers, or None to pass it on."""
        headers = _headers(scope)
        path = scope["path"]
        key = self.state.api_key
        if key is not None and path not in OPEN_PATHS:
            given = headers.get("authorization", "")
            if not secrets.compare_digest(given.encode("latin-1"), f"Bearer {key}".encode()):
                return ApiError(401, "AuthenticationError", "missing or wrong API key (send 'Authorization: Bearer <key>')")
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return ApiError(400, "BadRequestError", f"Content-Length: not a byte count (got {length[:40]!r})")
            if int(length) > self.state.max_body_bytes:
                return too_large(self.state.max_body_bytes, f"{int(length)} bytes")
        if length not in (None, "0") or "transfer-encoding" in headers:
            kind = headers.get("content-type")
            if kind is not None and not _is_json(kind):
                return ApiError(415, "UnsupportedMediaTypeError",
                                f"the body must be JSON (Content-Type: {_JSON}; got {kind[:80]!r})")
        engine = self.state.engine
        if path in GENERATING_PATHS and engine is not None and engine.unavailable is not None:
            return ApiError(503, "ServiceUnavailableError", engine.unavailable)
        return None


def too_large(limit: int, got: str) -> ApiError:
    return ApiError(413, "RequestTooLargeError", f"the body is {got}, more than --max-body-bytes {limit}")


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == _JSON or (media.startswith("application/") and media.endswith("+json"))


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


async def _send_error(send: Send, error: ApiError) -> None:
    body = json.dumps(error.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    headers += [(k.lower().encode(), str(v).encode()) for k, v in (error.headers or {}).items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(request: Any, limit: int, timeout_s: float) -> bytes:
    """The request's body, refused with a 413 once it passes ``limit`` bytes (a body
    without a ``Content-Length`` is counted as it comes), and with a 408 when it has
    not all come within ``timeout_s`` (``--read-timeout``)."""
    chunks: list[bytes] = []

    async def read() -> bytes:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit, f"more than {limit} bytes (sent without a Content-Length)")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, "RequestTimeoutError", f"the body did not arrive within --read-timeout {timeout_s:g}s "
                       f"({sum(map(len, chunks))} bytes came)", headers={"Connection": "close"}) from None


def parse_body(model: type[M], raw: bytes) -> M:
    """``raw`` validated as ``model`` (strict JSON: a lone surrogate such as ``"\\ud800"``
    is not text); a 400 naming the field, never echoing a long value. Call it off the
    event loop: a large body takes a while."""
    if not raw.strip():
        raise ApiError(400, "BadRequestError", f"the body is empty; send a JSON object ({_JSON})")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None

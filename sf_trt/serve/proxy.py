"""Ray Serve's own error answers in OpenAI's envelope.

Behind Ray Serve, some answers never reach an sf_trt replica: the proxy itself
refuses a request above a deployment's ``max_queued_requests`` (429 with
``Retry-After``, as ``sf-trt serve --ray`` configures it), answers 503 while no
replica is up, 500 when the replica serving a request died, 404 for a route no
application has. Ray writes those as plain text. :class:`OpenAIErrorBodies`, an
ASGI middleware Ray runs in its HTTP proxy (:func:`ray_proxy_middlewares`, named by
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH``), rewrites any plain-text error into
``{"error": {"message", "type", "param", "code"}}``, keeping the status and every
other header (``Retry-After`` included). JSON errors (the replicas' own) and
successful answers pass through untouched, streamed chunk by chunk. A request whose
replica died under it, which Ray ends with no answer or a cut stream, gets a 503
``ServiceUnavailableError`` (or, once a stream's headers are out, an SSE ``error``
event then ``data: [DONE]``) saying so: clients retry it, and a seeded request
answers the same on any replica.

:class:`UserRoutingKey`, the second middleware, gives a request its conversation's
routing key: it reads a JSON POST's ``user`` (the body is held, up to
:data:`ROUTING_BODY_LIMIT` bytes, and handed on unchanged) and sets Ray's session
header (``x-session-id``, or what ``RAY_SERVE_SESSION_ID_HEADER_KEY`` names) to a hash
of it, so the deployment's request router (``sf_trt.cli.ray_router``) can send every
turn of a ``user`` to the replica whose prefix cache holds the conversation.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
from typing import Any, Optional

__all__ = ["OpenAIErrorBodies", "UserRoutingKey", "ray_proxy_middlewares", "routing_key", "session_header", "PROXY_CALLBACK",
           "PROXY_CALLBACK_ENV", "ERROR_TYPES", "ROUTING_BODY_LIMIT"]

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "sf_trt.serve.proxy:ray_proxy_middlewares"
"""The value of :data:`PROXY_CALLBACK_ENV` that installs the middleware in Ray's proxies."""

LOST = ("the replica serving this request was lost (its process or machine died) before it finished; retry it: "
        "a seeded request answers the same tokens on any replica")

ERROR_TYPES = {
    400: "BadRequestError", 404: "NotFoundError", 408: "APITimeoutError", 429: "RateLimitError",
    499: "ClientDisconnected", 500: "InternalServerError", 503: "ServiceUnavailableError",
}


def _header(headers: Any, name: bytes) -> bytes:
    for k, v in headers or ():
        if bytes(k).lower() == name:
            return bytes(v)
    return b""


class OpenAIErrorBodies:
    """Pure ASGI middleware: plain-text responses with status >= 400 become OpenAI error JSON."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        held: dict | None = None
        body: list[bytes] = []
        started = ended = sse = False

        async def send_rewritten(message: dict) -> None:
            nonlocal held, started, ended, sse
            if message["type"] == "http.response.start":
                started = True
                kind = _header(message.get("headers"), b"content-type")
                sse = kind.startswith(b"text/event-stream")
                if message["status"] >= 400 and (not kind or kind.startswith(b"text/plain")):
                    held = message
                    return
            elif held is None and message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            elif held is not None and message["type"] == "http.response.body":
                body.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                status = held["status"]
                text = b"".join(body).decode("utf-8", errors="replace").strip() or f"HTTP {status}"
                payload = json.dumps({"error": {
                    "message": text, "type": ERROR_TYPES.get(status, "APIError"), "param": None, "code": status,
                }}).encode()
                headers = [(bytes(k), bytes(v)) for k, v in held.get("headers") or ()
                           if bytes(k).lower() not in (b"content-type", b"content-length")]
                headers += [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
                await send({**held, "headers": headers})
                await send({"type": "http.response.body", "body": payload})
                ended = True
                return
            await send(message)

        try:
            await self.app(scope, receive, send_rewritten)
        except Exception:  # noqa: BLE001 - answered below, as Ray would have left the client without one
            pass
        if ended:
            return
        # The replica was lost mid-request (its process or machine died) and Ray sent nothing
        # more: say so, rather than leave the client with a connection closed mid-answer.
        error = {"error": {"message": LOST, "type": "ServiceUnavailableError", "param": None, "code": 503}}
        if not started:
            payload = json.dumps(error).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
        elif sse:  # headers went out: the error travels in the stream, as the server's own do
            await send({"type": "http.response.body",
                        "body": f"event: error\ndata: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode()})
        else:
            await send({"type": "http.response.body", "body": b""})


SESSION_HEADER_ENV = "RAY_SERVE_SESSION_ID_HEADER_KEY"
"""Ray's setting of the header its proxy reads a request's session id from (``x-session-id`` unset)."""
ROUTING_BODY_LIMIT = 1 << 20
"""The most body bytes :class:`UserRoutingKey` holds to find ``user``; a larger body is routed without a key."""


def session_header() -> bytes:
    """The header Ray's proxy takes the session id from, lower case."""
    return os.environ.get(SESSION_HEADER_ENV, "x-session-id").lower().encode()


def routing_key(user: str) -> str:
    """The routing key of a ``user``: a hash, so the key says nothing of the name."""
    return hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _user_of(body: bytes) -> Optional[str]:
    try:
        user = json.loads(body).get("user")
    except (ValueError, AttributeError):  # not JSON, or not an object: the replica answers that
        return None
    return user if isinstance(user, str) and user else None


class UserRoutingKey:
    """Pure ASGI middleware: a POST whose JSON body names a ``user`` gets Ray's session header set
    to :func:`routing_key` of it (a session header the client sent is kept). The body is read
    here, up to :data:`ROUTING_BODY_LIMIT` bytes, and replayed to the app message by message."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        header = session_header()
        if scope.get("type") != "http" or scope.get("method") != "POST" or _header(scope.get("headers"), header):
            await self.app(scope, receive, send)
            return
        held: collections.deque = collections.deque()
        size, more = 0, True
        while more and size <= ROUTING_BODY_LIMIT:
            message = await receive()
            held.append(message)
            if message["type"] != "http.request":  # the client left: hand that on as it came
                break
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        user = None if more else _user_of(b"".join(m.get("body", b"") for m in held if m["type"] == "http.request"))
        if user is not None:
            scope = {**scope, "headers": [*scope.get("headers", ()), (header, routing_key(user).encode())]}

        async def replay() -> dict:
            return held.popleft() if held else await receive()

        await self.app(scope, replay, send)


def ray_proxy_middlewares() -> list:
    """Ray Serve's HTTP proxy callback: the middlewares its proxies run (Ray wraps its app in them in
    this order, so the routing key is set before anything else sees the request)."""
    from starlette.middleware import Middleware

    return [Middleware(OpenAIErrorBodies), Middleware(UserRoutingKey)]

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
successful answers pass through untouched, streamed chunk by chunk.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["OpenAIErrorBodies", "ray_proxy_middlewares", "PROXY_CALLBACK", "PROXY_CALLBACK_ENV", "ERROR_TYPES"]

PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "sf_trt.serve.proxy:ray_proxy_middlewares"
"""The value of :data:`PROXY_CALLBACK_ENV` that installs the middleware in Ray's proxies."""

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

        async def send_rewritten(message: dict) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                kind = _header(message.get("headers"), b"content-type")
                if message["status"] >= 400 and (not kind or kind.startswith(b"text/plain")):
                    held = message
                    return
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
                return
            await send(message)

        await self.app(scope, receive, send_rewritten)


def ray_proxy_middlewares() -> list:
    """Ray Serve's HTTP proxy callback: the middlewares its proxies run (this one)."""
    from starlette.middleware import Middleware

    return [Middleware(OpenAIErrorBodies)]

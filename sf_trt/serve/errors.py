"""Error responses: OpenAI's nested envelope ``{"error": {"message", "type", "param",
"code"}}`` (the app's docstring lists which status means what), and the error of
each thing that can go wrong: a refusal at submit, a body that does not validate, a
choice the engine failed."""

from __future__ import annotations

from typing import Optional

from fastapi.responses import JSONResponse

from ..abi import StatusError
from ..engine_loop import SHUTDOWN_ERROR, NotServing, Overloaded

__all__ = ["ApiError", "refusal", "validation_error", "http_error", "choice_failure"]


class ApiError(Exception):
    """An error response: HTTP status, OpenAI-style type, message, offending param."""

    def __init__(self, status: int, type_: str, message: str, param: Optional[str] = None, headers: Optional[dict] = None) -> None:
        super().__init__(message)
        self.status, self.type, self.message, self.param, self.headers = status, type_, message, param, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def refusal(exc: BaseException) -> ApiError:
    """The error response for what ``EngineLoop.submit`` raised."""
    if isinstance(exc, StatusError):
        return ApiError(400, exc.status.name, str(exc))
    if isinstance(exc, Overloaded):
        retry = max(1, round(exc.retry_after_s))
        return ApiError(429, "RateLimitError", f"the server is at capacity: {exc}; retry after {retry}s", headers={"Retry-After": str(retry)})
    if isinstance(exc, NotServing):
        return ApiError(503, "ServiceUnavailableError", str(exc))
    raise exc


def validation_error(errors: list[dict]) -> ApiError:
    """One 400 for pydantic's errors: unknown fields named first, then the rest."""
    def where(err: dict) -> str:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        return ".".join(loc) or "body"

    unknown = [where(e) for e in errors if e.get("type") == "extra_forbidden"]
    if unknown:
        return ApiError(400, "BadRequestError", f"unknown field(s): {', '.join(unknown)} (sf_trt refuses fields it does not know)", unknown[0])
    first = errors[0] if errors else {"msg": "invalid request"}
    if first.get("type") == "json_invalid":
        msg = str(first.get("msg"))
        hint = " (a lone UTF-16 surrogate such as \\ud800 is not text)" if "surrogate" in msg or "hex escape" in msg else ""
        return ApiError(400, "BadRequestError", f"the body is not valid JSON: {msg}{hint}")
    parts = []
    for e in errors[:4]:
        got = f" (got {_short(e['input'])})" if "input" in e and not isinstance(e["input"], (dict, list)) else ""
        parts.append(f"{where(e)}: {e.get('msg')}{got}")
    return ApiError(400, "BadRequestError", "; ".join(parts), where(first))


def _short(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error never echoes a long body back."""
    try:
        text = repr(value[: limit + 1] if isinstance(value, (str, bytes)) else value)
    except ValueError:  # an int of more digits than Python prints
        return "a number too long to show"
    return text if len(text) <= limit else f"{text[:limit]}..."


def http_error(status: int, detail: object) -> ApiError:
    """OpenAI's envelope for the framework's own errors (an unknown path, a wrong method)."""
    types = {404: "NotFoundError", 405: "MethodNotAllowedError"}
    return ApiError(status, types.get(status, "BadRequestError" if status < 500 else "InternalServerError"), str(detail))


def choice_failure(index: int, error: str) -> ApiError:
    """The error of choice ``index``, which the engine ended with ``error``: 503 when the
    server was shutting down, else 500 (a backend fault)."""
    message = f"choice {index} failed: {error}"
    if error.startswith(SHUTDOWN_ERROR):
        return ApiError(503, "ServiceUnavailableError", message)
    return ApiError(500, "InternalServerError", message)

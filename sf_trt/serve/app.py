"""The FastAPI app: OpenAI-compatible routes over an :class:`~sf_trt.engine_loop.EngineLoop`.

Routes translate HTTP to engine requests and engine outputs back to OpenAI's JSON
and SSE shapes; they never touch the Executor. Errors use OpenAI's nested envelope
``{"error": {"message", "type", "param", "code"}}`` (``code``: the HTTP status):

* 400 ``BadRequestError``: a body that does not validate (an unknown field is named
  in ``param``; a string where a number belongs; a lone surrogate), an unsupported
  field, a batch larger than the server can ever hold;
* 400 with the executor's ``Status`` name as ``type``: a request the engine refuses
  (``PROMPT_TOO_LONG``, ``BAD_SAMPLING_PARAMS``, ``TOKEN_OUT_OF_VOCAB``, ...);
* 401 ``AuthenticationError`` (``--api-key`` set, no or another Bearer token),
  before the body is read (:mod:`.guard`);
* 404 ``NotFoundError``: an unknown model or path; 405 ``MethodNotAllowedError``;
* 408 ``RequestTimeoutError``: the body did not arrive within ``--read-timeout``;
* 413 ``RequestTooLargeError``: a body over ``--max-body-bytes``, before it is read;
* 415 ``UnsupportedMediaTypeError``: a body whose ``Content-Type`` is not JSON;
* 429 ``RateLimitError`` with ``Retry-After`` when the queue of waiting requests is full;
* 503 ``ServiceUnavailableError`` while the model loads or the server drains;
* 500 ``InternalServerError``: a request the engine failed (a backend fault).

A streamed response whose request fails after the headers went out ends with an
SSE ``error`` event (``event: error``, ``data: {"error": {...}}``) then ``data: [DONE]``.

Bodies are read within the size and time limits (:func:`.guard.read_body`), then
parsed, tokenized and checked off the event loop, so a long prompt never stalls
other clients or ``/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any, Callable, Optional

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..version import __version__
from .errors import ApiError, choice_failure, http_error, validation_error
from .guard import Guard, parse_body, read_body
from .jobs import Job, abort_job, check_model, collect_job, submit_job
from .rendering import json_body, sse_body
from .schemas import ChatCompletionRequest, CompletionRequest
from .state import Loader, ServerState
from .tokenize import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest, detokenize, tokenize

__all__ = ["ServerState", "create_app", "ApiError"]

log = logging.getLogger("sf_trt.serve")


def _lifespan(state: ServerState, loader: Optional[Loader]):
    """Start-up and shut-down: load the model in the background (``loader``) or start the
    given engine; at shut-down drain the engine within ``state.drain_timeout_s``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        thread = None
        if loader is not None and state.engine is None:
            def load() -> None:
                try:
                    engine, tokenizer, max_context = loader()
                    engine.start()
                    state.tokenizer, state.max_context, state.engine = tokenizer, max_context, engine
                    log.info("model %s loaded: serving", state.model_name)
                except Exception as exc:  # noqa: BLE001 - reported by /health and every route
                    state.load_error = f"{type(exc).__name__}: {exc}"
                    log.error("the model failed to load: %s", state.load_error)

            thread = threading.Thread(target=load, name="sf_trt-load", daemon=True)
            thread.start()
        elif state.engine is not None and not state.engine.started:
            state.engine.start()
        try:
            yield
        finally:
            if thread is not None:
                thread.join()
            if state.engine is not None:
                await asyncio.to_thread(state.engine.shutdown, state.drain_timeout_s)

    return lifespan


def create_app(state: ServerState, loader: Optional[Loader] = None) -> FastAPI:
    """The app over ``state``; with ``loader`` the model loads in the background at startup."""
    lifespan = _lifespan(state, loader)
    app = FastAPI(title="sf_trt", version=__version__, lifespan=lifespan)
    app.state.sf = state
    app.add_middleware(Guard, state=state)  # the key, the body's size and type: before any route reads it

    @app.exception_handler(ApiError)
    async def _api_error(request: HttpRequest, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: HttpRequest, exc: RequestValidationError) -> JSONResponse:
        return validation_error(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: HttpRequest, exc: StarletteHTTPException) -> JSONResponse:
        return http_error(exc.status_code, exc.detail).response()

    @app.exception_handler(Exception)
    async def _bug(request: HttpRequest, exc: Exception) -> JSONResponse:  # logged with its traceback by the server
        return ApiError(500, "InternalServerError", f"the server failed: {type(exc).__name__}").response()

    async def off_loop(request: HttpRequest, work: Callable[[bytes], Any]) -> Any:
        raw = await read_body(request, state.max_body_bytes, state.read_timeout_s)
        return await asyncio.to_thread(work, raw)

    @app.get("/health")
    @app.head("/health", include_in_schema=False)
    async def health() -> JSONResponse:
        if state.load_error is not None:
            return JSONResponse({"status": "failed", "error": state.load_error}, status_code=503)
        if state.engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if state.engine.unavailable is not None:
            reason = state.engine.failure or "shutting down"
            return JSONResponse({"status": "unavailable", "error": reason}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        body = await state.metrics_view() if state.metrics_view is not None else state.metrics.render()
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict:
        return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "sf_trt",
                "max_model_len": state.max_context or None}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict:
        check_model(state, model_id)
        return model_card()

    @app.post("/v1/completions", openapi_extra=_body(CompletionRequest))
    async def completions(request: HttpRequest) -> Response:
        job = await off_loop(request, lambda raw: Job.completion(state, parse_body(CompletionRequest, raw)))
        return await _serve(state, request, job)

    @app.post("/v1/chat/completions", openapi_extra=_body(ChatCompletionRequest))
    async def chat_completions(request: HttpRequest) -> Response:
        job = await off_loop(request, lambda raw: Job.chat(state, parse_body(ChatCompletionRequest, raw)))
        return await _serve(state, request, job)

    # the answer is rendered off the event loop too: a long text's ids make a long JSON body
    @app.post("/tokenize", openapi_extra=_body(TokenizeCompletionRequest, TokenizeChatRequest))
    async def tokenize_route(request: HttpRequest) -> JSONResponse:
        return await off_loop(request, lambda raw: JSONResponse(tokenize(state, raw)))

    @app.post("/detokenize", openapi_extra=_body(DetokenizeRequest))
    async def detokenize_route(request: HttpRequest) -> JSONResponse:
        return await off_loop(request, lambda raw: JSONResponse(detokenize(state, raw)))

    return app


def _body(*models: Any) -> dict:
    """The OpenAPI request body of a route that parses its own body (off the event loop)."""
    schemas = [m.model_json_schema() for m in models]
    schema = schemas[0] if len(schemas) == 1 else {"oneOf": schemas}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


async def _serve(state: ServerState, request: HttpRequest, job: Job) -> Response:
    submit_job(state, job)
    if job.body.stream:
        return StreamingResponse(sse_body(state, job), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    collect = asyncio.create_task(collect_job(job))
    watch = asyncio.create_task(_disconnected(request))
    try:
        done, _ = await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself is cancelled (Ray Serve: the client went away)
        collect.cancel()
        if abort_job(state, job):
            state.metrics.client_disconnected()
        raise
    finally:
        watch.cancel()
    if collect not in done:  # the client went away: free the lanes
        collect.cancel()
        if abort_job(state, job):
            state.metrics.client_disconnected()
        return Response(status_code=499)
    collect.result()
    failed = [c for c in job.choices if c.last is not None and c.last.error is not None]
    if failed:
        raise choice_failure(failed[0].index, failed[0].last.error)
    return JSONResponse(json_body(state, job))


async def _disconnected(request: HttpRequest) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return

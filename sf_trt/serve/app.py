"""The FastAPI app: OpenAI-compatible routes over an :class:`~sf_trt.engine_loop.EngineLoop`.

Routes translate HTTP to engine requests and engine outputs back to OpenAI's JSON
and SSE shapes; they never touch the Executor. Errors use OpenAI's nested envelope
``{"error": {"message", "type", "param", "code"}}`` (``code``: the HTTP status):

* 400 ``BadRequestError``: a body that does not validate (an unknown field is named
  in ``param``), an unsupported field, a prompt that does not fit;
* 400 with the executor's ``Status`` name as ``type``: a request the engine refuses
  (``PROMPT_TOO_LONG``, ``BAD_SAMPLING_PARAMS``, ``TOKEN_OUT_OF_VOCAB``, ...);
* 401 ``AuthenticationError`` (``--api-key`` set, no or another Bearer token);
* 404 ``NotFoundError``: an unknown model;
* 429 ``RateLimitError`` with ``Retry-After`` when the queue of waiting requests is full;
* 503 ``ServiceUnavailableError`` while the model loads or the server shuts down;
* 500 ``InternalServerError``: a request the engine failed (a backend fault).

A streamed response whose request fails after the headers went out ends with an
SSE ``error`` event (``event: error``, ``data: {"error": {...}}``) then ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import secrets
import threading
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from .. import __version__
from ..abi import Sampling, SamplingFlag, SamplingParams, Status, StatusError
from ..drafting import DEFAULT_SCOPE
from ..engine import TokenLogprobs
from ..engine_loop import SHUTDOWN_ERROR, EngineLoop, NotServing, Output, Overloaded, RequestStream
from ..scheduler import DEFAULT_DRAFTER, Request, choice_key
from ..tokenizer import TokenizerError
from .metrics import ServerMetrics, finish_reason
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingFields

__all__ = ["ServerState", "create_app", "ApiError"]

log = logging.getLogger("sf_trt.serve")


class ApiError(Exception):
    """An error response: HTTP status, OpenAI-style type, message, offending param."""

    def __init__(self, status: int, type_: str, message: str, param: Optional[str] = None, headers: Optional[dict] = None) -> None:
        super().__init__(message)
        self.status, self.type, self.message, self.param, self.headers = status, type_, message, param, headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _refusal(exc: BaseException) -> ApiError:
    """The error response for what ``EngineLoop.submit`` raised."""
    if isinstance(exc, StatusError):
        return ApiError(400, exc.status.name, str(exc))
    if isinstance(exc, Overloaded):
        retry = max(1, round(exc.retry_after_s))
        return ApiError(429, "RateLimitError", f"the server is at capacity: {exc}; retry after {retry}s", headers={"Retry-After": str(retry)})
    if isinstance(exc, NotServing):
        return ApiError(503, "ServiceUnavailableError", str(exc))
    raise exc


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
        elif state.engine is not None and state.engine._thread is None:
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

    @app.exception_handler(ApiError)
    async def _api_error(request: HttpRequest, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: HttpRequest, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc.errors()).response()

    def authorize(request: HttpRequest) -> None:
        if state.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {state.api_key}".encode()):
            raise ApiError(401, "AuthenticationError", "missing or wrong API key (send 'Authorization: Bearer <key>')")

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.load_error is not None:
            return JSONResponse({"status": "failed", "error": state.load_error}, status_code=503)
        if state.engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if not state.engine.serving:
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

    @app.get("/v1/models")
    async def models(request: HttpRequest) -> dict:
        authorize(request)
        return {"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.created, "owned_by": "sf_trt",
            "max_model_len": state.max_context or None,
        }]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HttpRequest) -> Response:
        authorize(request)
        return await _serve(state, request, _Job.completion(state, body))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: HttpRequest) -> Response:
        authorize(request)
        return await _serve(state, request, _Job.chat(state, body))

    return app


def _validation_error(errors: list[dict]) -> ApiError:
    """One 400 for pydantic's errors: unknown fields named first, then the rest."""
    def where(err: dict) -> str:
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        return ".".join(loc) or "body"

    unknown = [where(e) for e in errors if e.get("type") == "extra_forbidden"]
    if unknown:
        return ApiError(400, "BadRequestError", f"unknown field(s): {', '.join(unknown)} (sf_trt refuses fields it does not know)", unknown[0])
    first = errors[0] if errors else {"msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return ApiError(400, "BadRequestError", f"the body is not valid JSON: {first.get('msg')}")
    parts = []
    for e in errors[:4]:
        got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], (dict, list)) else ""
        parts.append(f"{where(e)}: {e.get('msg')}{got}")
    return ApiError(400, "BadRequestError", "; ".join(parts), where(first))


# -- a request's jobs --------------------------------------------------------------------------------


@dataclasses.dataclass
class _Choice:
    index: int
    prompt_index: int
    request: Request
    stream: Optional[RequestStream] = None
    tokens: list = dataclasses.field(default_factory=list)
    text: str = ""
    logprobs: list = dataclasses.field(default_factory=list)
    last: Optional[Output] = None


@dataclasses.dataclass
class _Job:
    """One HTTP request: its prompts and the engine requests of its choices."""

    kind: str  # "chat" | "completion"
    id: str
    body: Any
    prompts: list[list[int]]
    prompt_texts: list[str]
    choices: list[_Choice]
    seed: int
    logprobs: Optional[int]
    return_token_ids: bool

    @staticmethod
    def completion(state: ServerState, body: CompletionRequest) -> "_Job":
        engine = state.ready_engine()
        _check_common(state, body)
        if body.echo and body.logprobs is not None:
            raise ApiError(400, "BadRequestError", "echo with logprobs is not supported (prompt logprobs)", "echo")
        prompts, texts = [], []
        for p in body.prompts():
            ids = _encode(state, p, "prompt") if isinstance(p, str) else list(p)
            prompts.append(ids)
            if isinstance(p, str) or not body.echo:
                texts.append(p if isinstance(p, str) else "")
                continue
            try:
                texts.append(state.tokenizer.decode(ids))
            except TokenizerError as exc:
                raise ApiError(400, Status.TOKEN_OUT_OF_VOCAB.name, f"prompt: {exc}", "prompt") from None
        if not prompts:
            raise ApiError(400, "BadRequestError", "prompt: no prompt given", "prompt")
        return _Job._build(state, engine, "completion", "cmpl", body, prompts, texts, body.logprobs, body.max_tokens)

    @staticmethod
    def chat(state: ServerState, body: ChatCompletionRequest) -> "_Job":
        engine = state.ready_engine()
        _check_common(state, body)
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "BadRequestError", "top_logprobs needs logprobs: true", "top_logprobs")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:  # contents stay text: a message cannot forge a control token (a role turn)
            ids = state.tokenizer.encode_chat(messages, add_generation_prompt=True)
        except TokenizerError as exc:
            raise ApiError(400, "BadRequestError", str(exc), "messages") from None
        k = (body.top_logprobs or 0) if body.logprobs else None
        # chat has no echo: its prompt text is never sent back
        return _Job._build(state, engine, "chat", "chatcmpl", body, [ids], [""], k, body.max_completion_tokens or body.max_tokens)

    @staticmethod
    def _build(state, engine, kind, prefix, body: SamplingFields, prompts, texts, logprobs, max_tokens) -> "_Job":
        opts = body.sf_trt
        speculate = (opts.speculate if opts and opts.speculate else None) or state.default_speculate
        max_draft = (opts.max_draft if opts and opts.max_draft else None) or state.default_max_draft
        flags = SamplingFlag.IGNORE_EOS if opts and opts.ignore_eos else SamplingFlag(0)
        temperature = 1.0 if body.temperature is None else body.temperature
        mode = Sampling.GPU_GREEDY if temperature == 0 else Sampling.GPU_GUMBEL
        seed = body.seed if body.seed is not None else secrets.randbits(63)
        choices = []
        for p, ids in enumerate(prompts):
            mt = _max_tokens(state, ids, max_tokens, "max_completion_tokens" if kind == "chat" and body.max_completion_tokens else "max_tokens")
            try:
                params = SamplingParams(
                    temperature=temperature if mode == Sampling.GPU_GUMBEL else 1.0, top_p=1.0 if body.top_p is None else body.top_p,
                    top_k=max(0, body.top_k or 0), min_p=body.min_p or 0.0, max_tokens=mt, flags=flags,
                )
            except StatusError as exc:
                raise _refusal(exc) from None
            for i in range(body.n):
                index = p * body.n + i
                choices.append(_Choice(index, p, Request(
                    ids, mode, params, seed=choice_key(seed, index), speculate=speculate != "none",
                    drafter=speculate if speculate != "none" else DEFAULT_DRAFTER, max_draft=max_draft,
                    stop=body.stops(), stop_token_ids=tuple(body.stop_token_ids or ()), logprobs=logprobs,
                    draft_scope=draft_scope(body.user),
                )))
        for c in choices:
            try:
                engine.check(c.request)
            except StatusError as exc:
                raise _refusal(exc) from None
        return _Job(kind, f"{prefix}-{uuid.uuid4().hex}", body, prompts, texts, choices, seed, logprobs,
                    bool(opts and opts.return_token_ids))

    @property
    def created(self) -> int:
        return int(time.time())


def _check_common(state: ServerState, body: SamplingFields) -> None:
    if body.model is not None and body.model != state.model_name:
        raise ApiError(404, "NotFoundError", f"the model {body.model!r} does not exist (served: {state.model_name!r})", "model")
    bad = body.unsupported()
    if bad:
        raise ApiError(400, "BadRequestError", f"unsupported field(s): {', '.join(bad)} (sf_trt cannot honour them yet)", bad[0])
    if any(not s for s in body.stops()):
        raise ApiError(400, "BadRequestError", "stop: stop strings must not be empty", "stop")


def draft_scope(user: Optional[str]) -> str:
    """The suffix drafter's corpus a request drafts from and joins: one per ``user``
    (requests that name none share the default one). Drafts never change a token,
    so scopes are about privacy and relevance, not output."""
    return DEFAULT_SCOPE if not user else "user:" + hashlib.sha256(user.encode("utf-8", "surrogatepass")).hexdigest()


def _encode(state: ServerState, text: str, param: str) -> list[int]:
    try:
        return state.tokenizer.encode(text)
    except TokenizerError as exc:
        raise ApiError(400, "BadRequestError", str(exc), param) from None


def _max_tokens(state: ServerState, ids: list[int], asked: Optional[int], param: str) -> int:
    """The output budget: what was asked, or what the context leaves; a 400 if it does not fit."""
    room = state.max_context - len(ids)
    if room < 1 or (asked is not None and asked > room):
        want = f"{len(ids) + asked} tokens ({len(ids)} in the prompt, {asked} in the completion)" if asked else f"{len(ids)} tokens in the prompt"
        raise ApiError(
            400, Status.PROMPT_TOO_LONG.name,
            f"this model's context is {state.max_context} tokens; the request needs {want}. "
            f"Shorten the prompt or lower {param} (at most {max(0, room)} fit)", param if room >= 1 else "prompt",
        )
    return asked if asked is not None else room


# -- running a job ----------------------------------------------------------------------------------


def _submit(state: ServerState, job: _Job) -> None:
    engine = state.ready_engine()
    try:
        for c in job.choices:
            c.stream = engine.submit(c.request, request_id=f"{job.id}-{c.index}")
    except (StatusError, Overloaded, NotServing) as exc:
        _abort(state, job)
        raise _refusal(exc) from None


def _abort(state: ServerState, job: _Job) -> bool:
    """Abort every unfinished choice; True if any was still running."""
    live = False
    for c in job.choices:
        if c.stream is not None and not c.stream.finished and state.engine is not None:
            live |= state.engine.abort(c.stream.request_id)
    return live


async def _outputs(job: _Job) -> AsyncIterator[tuple[_Choice, Output]]:
    """Every choice's outputs as they come."""
    if len(job.choices) == 1:
        c = job.choices[0]
        async for out in c.stream:
            yield c, out
        return
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(c: _Choice) -> None:
        async for out in c.stream:
            await merged.put((c, out))

    tasks = [asyncio.create_task(pump(c)) for c in job.choices]
    try:
        for _ in range(len(job.choices)):
            while True:
                c, out = await merged.get()
                yield c, out
                if out.finished:
                    break
    finally:
        for t in tasks:
            t.cancel()


async def _serve(state: ServerState, request: HttpRequest, job: _Job) -> Response:
    _submit(state, job)
    if job.body.stream:
        return StreamingResponse(_sse(state, job), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    collect = asyncio.create_task(_collect(job))
    watch = asyncio.create_task(_disconnected(request))
    try:
        done, _ = await asyncio.wait({collect, watch}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the handler itself is cancelled (Ray Serve: the client went away)
        collect.cancel()
        if _abort(state, job):
            state.metrics.client_disconnected()
        raise
    finally:
        watch.cancel()
    if collect not in done:  # the client went away: free the lanes
        collect.cancel()
        if _abort(state, job):
            state.metrics.client_disconnected()
        return Response(status_code=499)
    collect.result()
    failed = [c for c in job.choices if c.last is not None and c.last.error is not None]
    if failed:
        raise _failure(failed[0])
    return JSONResponse(_response(state, job))


def _failure(c: _Choice) -> ApiError:
    """The error of a choice the engine ended with an error: 503 when the server was
    shutting down, else 500 (a backend fault)."""
    message = f"choice {c.index} failed: {c.last.error}"
    if c.last.error.startswith(SHUTDOWN_ERROR):
        return ApiError(503, "ServiceUnavailableError", message)
    return ApiError(500, "InternalServerError", message)


async def _disconnected(request: HttpRequest) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect(job: _Job) -> None:
    async with contextlib.aclosing(_outputs(job)) as outputs:
        async for c, out in outputs:
            _take(c, out)


def _take(c: _Choice, out: Output) -> None:
    c.tokens += out.tokens
    c.text += out.text or ""
    if out.logprobs is not None and len(out.logprobs):
        c.logprobs.append(out.logprobs)
    c.last = out


# -- shapes of responses ----------------------------------------------------------------------------


def _usage(job: _Job) -> dict:
    completion = sum(c.last.completion_tokens for c in job.choices if c.last is not None)
    prompt = sum(len(p) for p in job.prompts)
    spec = {
        "num_drafts": sum(c.last.drafts for c in job.choices if c.last),
        "num_draft_tokens": sum(c.last.proposed for c in job.choices if c.last),
        "num_accepted_tokens": sum(c.last.accepted for c in job.choices if c.last),
    }
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion, "sf_trt": spec}


def _token_str(tok: Any, token: int) -> str:
    return tok.token_bytes(token).decode("utf-8", errors="replace")


def _chat_logprobs(tok: Any, tokens: list[int], lp: Optional[TokenLogprobs]) -> Optional[dict]:
    if lp is None:
        return None
    content = []
    for j, t in enumerate(tokens):
        top = [{"token": _token_str(tok, int(i)), "logprob": float(v), "bytes": list(tok.token_bytes(int(i)))}
               for i, v in zip(lp.top_ids[j], lp.top_logprobs[j])]
        content.append({"token": _token_str(tok, t), "logprob": float(lp.logprob[j]), "bytes": list(tok.token_bytes(t)), "top_logprobs": top})
    return {"content": content}


def _completion_logprobs(tok: Any, tokens: list[int], lp: Optional[TokenLogprobs], offset: int) -> Optional[dict]:
    if lp is None:
        return None
    strs = [_token_str(tok, t) for t in tokens]
    offsets = []
    for s in strs:
        offsets.append(offset)
        offset += len(s)
    top = [{_token_str(tok, int(i)): float(v) for i, v in zip(lp.top_ids[j], lp.top_logprobs[j])} for j in range(len(tokens))]
    return {"tokens": strs, "token_logprobs": [float(x) for x in lp.logprob], "top_logprobs": top, "text_offset": offsets}


def _lp(c: _Choice, k: Optional[int]) -> Optional[TokenLogprobs]:
    return None if k is None else TokenLogprobs.concat(c.logprobs, k)


def _response(state: ServerState, job: _Job) -> dict:
    tok = state.tokenizer
    choices = []
    for c in job.choices:
        out = c.last
        item: dict[str, Any] = {"index": c.index}
        if job.kind == "chat":
            item["message"] = {"role": "assistant", "content": c.text}
            item["logprobs"] = _chat_logprobs(tok, c.tokens, _lp(c, job.logprobs))
        else:
            echo = job.prompt_texts[c.prompt_index] if job.body.echo else ""
            item["text"] = echo + c.text
            item["logprobs"] = _completion_logprobs(tok, c.tokens, _lp(c, job.logprobs), len(echo))
        item["finish_reason"] = finish_reason(out.finish, out.error)
        item["stop_reason"] = out.stop_reason
        if job.return_token_ids:
            item["token_ids"] = c.tokens
        choices.append(item)
    return {
        "id": job.id, "object": "chat.completion" if job.kind == "chat" else "text_completion", "created": job.created,
        "model": state.model_name, "choices": choices, "usage": _usage(job), "system_fingerprint": f"sf_trt-{__version__}",
        "sf_trt": {"seed": job.seed},
    }


def _sse_data(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _sse(state: ServerState, job: _Job) -> AsyncIterator[str]:
    """The SSE body: chunks as outputs come, the usage chunk if asked, then ``[DONE]``;
    a failed choice ends the stream with an ``error`` event. A client that goes away
    cancels this generator, which aborts the choices still running."""
    tok = state.tokenizer
    chat = job.kind == "chat"
    include_usage = bool(job.body.stream_options and job.body.stream_options.include_usage)
    base = {"id": job.id, "object": "chat.completion.chunk" if chat else "text_completion", "created": job.created,
            "model": state.model_name, "system_fingerprint": f"sf_trt-{__version__}", "sf_trt": {"seed": job.seed}}
    if include_usage:
        base["usage"] = None

    def chunk(item: dict) -> str:
        return _sse_data({**base, "choices": [item]})

    finished = False
    outputs = None
    offsets = {c.index: 0 for c in job.choices}
    try:
        for c in job.choices:
            if chat:
                yield chunk({"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None})
            elif job.body.echo:
                echo = job.prompt_texts[c.prompt_index]
                offsets[c.index] = len(echo)
                yield chunk({"index": c.index, "text": echo, "logprobs": None, "finish_reason": None})
        outputs = _outputs(job)
        async for c, out in outputs:
            _take(c, out)
            if out.error is not None:
                _abort(state, job)
                yield f"event: error\n{_sse_data(_failure(c).body())}"
                yield "data: [DONE]\n\n"
                finished = True
                return
            lp = out.logprobs if job.logprobs is not None else None
            if out.text or (out.tokens and (lp is not None or job.return_token_ids)):
                if chat:
                    item = {"index": c.index, "delta": {"content": out.text or ""}, "logprobs": _chat_logprobs(tok, out.tokens, lp), "finish_reason": None}
                else:
                    item = {"index": c.index, "text": out.text or "", "finish_reason": None,
                            "logprobs": _completion_logprobs(tok, out.tokens, lp, offsets[c.index])}
                    offsets[c.index] += sum(len(_token_str(tok, t)) for t in out.tokens)
                if job.return_token_ids:
                    item["token_ids"] = out.tokens
                yield chunk(item)
            if out.finished:
                end = {"index": c.index, "finish_reason": finish_reason(out.finish, out.error), "stop_reason": out.stop_reason, "logprobs": None}
                end.update({"delta": {}} if chat else {"text": ""})
                if job.return_token_ids:
                    end["token_ids"] = []
                yield chunk(end)
        if include_usage:
            yield _sse_data({**base, "choices": [], "usage": _usage(job)})
        yield "data: [DONE]\n\n"
        finished = True
    finally:
        if not finished and _abort(state, job):  # first: nothing below may be awaited once cancelled
            state.metrics.client_disconnected()
        if outputs is not None:
            with contextlib.suppress(BaseException):
                await outputs.aclose()

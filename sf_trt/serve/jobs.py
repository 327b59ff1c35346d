"""A request's job: one HTTP request's prompts, checked and turned into engine
requests (one per choice), submitted, followed and aborted.

A body is checked here, before anything is queued: the model, unsupported fields,
stop strings, prompts that do not fit the context (``PROMPT_TOO_LONG``), sampling
parameters, and every choice's request against the engine (``engine.check``).
A prompt's size is checked before it is tokenized: a text over ``--max-prompt-bytes``,
or one whose bytes alone prove it more tokens than the context holds, is refused
without tokenizing it. The routes build jobs off the event loop (tokenizing a long
prompt takes a while).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import secrets
import time
import uuid
from typing import Any, AsyncIterator, Optional

from ..abi import Sampling, SamplingFlag, SamplingParams, Status, StatusError
from ..drafting import DEFAULT_SCOPE
from ..engine_loop import NotServing, Output, Overloaded, RequestStream
from ..scheduler import DEFAULT_DRAFTER, Request, choice_key
from ..tokenizer import TokenizerError
from .errors import ApiError, refusal
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from .state import ServerState
from .structured import request_grammar
from .tools import ToolPlan, chat_messages, tool_family, tool_plan

__all__ = ["Choice", "Job", "draft_scope", "submit_job", "abort_job", "job_outputs", "collect_job", "take_output",
           "encode_text", "encode_messages", "check_model", "COMPLETION_MAX_TOKENS"]

COMPLETION_MAX_TOKENS = 16
"""``/v1/completions``' ``max_tokens`` when a request names none (OpenAI's and vLLM's default)."""


@dataclasses.dataclass
class Choice:
    index: int
    prompt_index: int
    request: Request
    stream: Optional[RequestStream] = None
    tokens: list = dataclasses.field(default_factory=list)
    text: str = ""
    logprobs: list = dataclasses.field(default_factory=list)
    last: Optional[Output] = None
    prompt_logprobs: Optional[Any] = None
    """Its prompt's :class:`~sf_trt.engine.TokenLogprobs` (tokens 1..), when asked for."""


@dataclasses.dataclass
class Job:
    """One HTTP request: its prompts and the engine requests of its choices."""

    kind: str  # "chat" | "completion"
    id: str
    body: Any
    prompts: list[list[int]]
    prompt_texts: list[str]
    choices: list[Choice]
    seed: int
    logprobs: Optional[int]
    return_token_ids: bool
    tools: Optional[ToolPlan] = None
    """A chat request's forced tool call (its output is parsed into ``tool_calls``)."""

    @staticmethod
    def completion(state: ServerState, body: CompletionRequest) -> "Job":
        engine = state.ready_engine()
        _check_common(state, body)
        prompts, texts = [], []
        for p in body.prompts():
            if not isinstance(p, str):
                _check_fits(state, len(p), "prompt", f"{len(p)} tokens in the prompt")
            ids = encode_text(state, p, "prompt") if isinstance(p, str) else list(p)
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
        # echo with logprobs scores the prompt too (lm-eval's loglikelihood), from the prefill's rows
        wanted = [k for k in (body.prompt_logprobs, body.logprobs if body.echo else None) if k is not None]
        return Job._build(state, engine, "completion", "cmpl", body, prompts, texts, body.logprobs, body.max_tokens,
                          max(wanted) if wanted else None, default_max_tokens=COMPLETION_MAX_TOKENS)

    @staticmethod
    def chat(state: ServerState, body: ChatCompletionRequest) -> "Job":
        engine = state.ready_engine()
        _check_common(state, body)
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "BadRequestError", "top_logprobs needs logprobs: true", "top_logprobs")
        if body.max_tokens == 0:
            raise ApiError(400, "BadRequestError", "max_tokens: 0 generates nothing; to score a prompt use /v1/completions with echo and logprobs", "max_tokens")
        family = tool_family(state.tokenizer)
        native = family is not None
        tools = tool_plan(body.tools, body.tool_choice, family)
        ids = encode_messages(state, chat_messages(body.messages, tools, native), tools=list(tools.tools) if tools and tools.native else None)
        k = (body.top_logprobs or 0) if body.logprobs else None
        # chat has no echo: its prompt text is never sent back
        job = Job._build(state, engine, "chat", "chatcmpl", body, [ids], [""], k, body.max_completion_tokens or body.max_tokens,
                         body.prompt_logprobs, tool_grammar=tools.grammar() if tools else None)
        job.tools = tools
        return job

    @staticmethod
    def _build(state, engine, kind, prefix, body: SamplingFields, prompts, texts, logprobs, max_tokens, prompt_logprobs,
               default_max_tokens: Optional[int] = None, tool_grammar: Optional[tuple] = None) -> "Job":
        opts = body.sf_trt
        speculate = (opts.speculate if opts and opts.speculate else None) or state.default_speculate
        max_draft = (opts.max_draft if opts and opts.max_draft else None) or state.default_max_draft
        flags = SamplingFlag.IGNORE_EOS if body.ignores_eos else SamplingFlag(0)
        temperature = 1.0 if body.temperature is None else body.temperature
        mode = Sampling.GPU_GREEDY if temperature == 0 else Sampling.GPU_GUMBEL
        seed = body.seed if body.seed is not None else secrets.randbits(63)
        prompt_only = max_tokens == 0
        try:
            bias = body.bias_pairs()
        except ValueError as exc:
            raise ApiError(400, Status.BAD_SAMPLING_PARAMS.name, str(exc), "logit_bias") from None
        grammar = request_grammar(state, body, tool_grammar)
        choices = []
        for p, ids in enumerate(prompts):
            mt = 0 if prompt_only else _max_tokens(
                state, ids, max_tokens, "max_completion_tokens" if kind == "chat" and body.max_completion_tokens else "max_tokens",
                default_max_tokens)
            try:
                params = SamplingParams(
                    temperature=temperature if mode == Sampling.GPU_GUMBEL else 1.0, top_p=1.0 if body.top_p is None else body.top_p,
                    top_k=max(0, body.top_k or 0), min_p=body.min_p or 0.0, max_tokens=mt, flags=flags,
                    presence_penalty=body.presence_penalty or 0.0, frequency_penalty=body.frequency_penalty or 0.0,
                    repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
                    logit_bias=bias, min_tokens=body.min_tokens or 0, grammar=grammar,
                )
            except StatusError as exc:
                raise refusal(exc) from None
            for i in range(body.n):
                index = p * body.n + i
                try:  # min_tokens holds the stop ids back: the request checks them into its params
                    request = Request(
                        ids, mode, params, seed=choice_key(seed, index), speculate=speculate != "none",
                        drafter=speculate if speculate != "none" else DEFAULT_DRAFTER, max_draft=max_draft,
                        stop=body.stops(), stop_token_ids=tuple(body.stop_token_ids or ()), logprobs=logprobs,
                        draft_scope=draft_scope(body.user), prompt_logprobs=prompt_logprobs, prompt_only=prompt_only,
                    )
                except StatusError as exc:
                    raise refusal(exc) from None
                choices.append(Choice(index, p, request))
        for c in choices:
            try:
                engine.check(c.request)
            except StatusError as exc:
                raise refusal(exc) from None
        return Job(kind, f"{prefix}-{uuid.uuid4().hex}", body, prompts, texts, choices, seed, logprobs,
                    bool(opts and opts.return_token_ids))

    @property
    def created(self) -> int:
        return int(time.time())


def check_model(state: ServerState, model: Optional[str]) -> None:
    """A 404 for a model this server does not serve (none named: the served one)."""
    if model is not None and model != state.model_name:
        raise ApiError(404, "NotFoundError", f"the model {model!r} does not exist (served: {state.model_name!r})", "model")


def _check_common(state: ServerState, body: SamplingFields) -> None:
    check_model(state, body.model)
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


def _check_text_size(state: ServerState, size: int, param: str, fit_context: bool) -> None:
    """Refuse, before tokenizing, a prompt text of ``size`` UTF-8 bytes over
    ``--max-prompt-bytes`` or (``fit_context``) whose bytes alone prove it longer than the context."""
    if size > state.max_prompt_bytes:
        raise ApiError(400, Status.PROMPT_TOO_LONG.name, f"{param}: {size} bytes of text, more than --max-prompt-bytes {state.max_prompt_bytes}", param)
    per_token = getattr(state.tokenizer, "max_token_bytes", None)
    if per_token and fit_context:
        at_least = -(-size // per_token)
        _check_fits(state, at_least, param, f"at least {at_least} tokens in the prompt ({size} bytes, at most {per_token} a token)")


def _check_fits(state: ServerState, num_tokens: int, param: str, what: str) -> None:
    if num_tokens >= state.max_context:
        raise ApiError(400, Status.PROMPT_TOO_LONG.name,
                       f"this model's context is {state.max_context} tokens; the request needs {what}. Shorten the prompt", param)


def _utf8_size(text: str, param: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a lone surrogate that came in some other way than JSON
        raise ApiError(400, "BadRequestError", f"{param}: not valid text ({exc.reason} at character {exc.start})", param) from None


def encode_text(state: ServerState, text: str, param: str, fit_context: bool = True) -> list[int]:
    """The ids of a prompt text, its size checked first (module docstring; ``fit_context``
    False: only ``--max-prompt-bytes``, for ``/tokenize``). Off the event loop."""
    _check_text_size(state, _utf8_size(text, param), param, fit_context)
    try:
        return state.tokenizer.encode(text)
    except TokenizerError as exc:
        raise ApiError(400, "BadRequestError", str(exc), param) from None


def encode_messages(state: ServerState, messages: list[dict], add_generation_prompt: bool = True, fit_context: bool = True,
                    tools: Optional[list] = None) -> list[int]:
    """The ids of chat messages in the model's template, their contents' size checked
    first (as :func:`encode_text`). Contents stay text: a message cannot forge a control
    token (a role turn). ``tools``: given to a template with tool support (``tools=``)."""
    _check_text_size(state, sum(_utf8_size(m["content"], "messages") for m in messages), "messages", fit_context)
    try:
        return state.tokenizer.encode_chat(messages, add_generation_prompt=add_generation_prompt, **({"tools": tools} if tools else {}))
    except TokenizerError as exc:
        raise ApiError(400, "BadRequestError", str(exc), "messages") from None


def _max_tokens(state: ServerState, ids: list[int], asked: Optional[int], param: str, default: Optional[int] = None) -> int:
    """The output budget: what was asked, or ``default`` (or less, if less fits), or what the
    context leaves; a 400 if what was asked does not fit."""
    room = state.max_context - len(ids)
    if asked is None and default is not None and room >= 1:
        return min(default, room)
    if room < 1 or (asked is not None and asked > room):
        want = f"{len(ids) + asked} tokens ({len(ids)} in the prompt, {asked} in the completion)" if asked else f"{len(ids)} tokens in the prompt"
        raise ApiError(
            400, Status.PROMPT_TOO_LONG.name,
            f"this model's context is {state.max_context} tokens; the request needs {want}. "
            f"Shorten the prompt or lower {param} (at most {max(0, room)} fit)", param if room >= 1 else "prompt",
        )
    return asked if asked is not None else room


def submit_job(state: ServerState, job: Job) -> None:
    engine = state.ready_engine()
    if len(job.choices) > engine.capacity:  # a 429 would say "retry" to a request that can never be taken
        raise ApiError(
            400, "BadRequestError",
            f"the request asks for {len(job.choices)} completions (prompts x n); this server holds at most {engine.capacity} "
            f"at once ({engine.num_lanes} lanes, --max-num-seqs, and {engine.config.max_queued} waiting, --max-queued-requests): "
            "split the batch", "n" if job.body.n > 1 else "prompt",
        )
    try:
        for c in job.choices:
            c.stream = engine.submit(c.request, request_id=f"{job.id}-{c.index}", checked=True)  # Job._build checked it
    except (StatusError, Overloaded, NotServing) as exc:
        abort_job(state, job)
        raise refusal(exc) from None


def abort_job(state: ServerState, job: Job) -> bool:
    """Abort every unfinished choice; True if any was still running."""
    live = False
    for c in job.choices:
        if c.stream is not None and not c.stream.finished and state.engine is not None:
            live |= state.engine.abort(c.stream.request_id)
    return live


async def job_outputs(job: Job) -> AsyncIterator[tuple[Choice, Output]]:
    """Every choice's outputs as they come."""
    if len(job.choices) == 1:
        c = job.choices[0]
        async for out in c.stream:
            yield c, out
        return
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(c: Choice) -> None:
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


async def collect_job(job: Job) -> None:
    async with contextlib.aclosing(job_outputs(job)) as outputs:
        async for c, out in outputs:
            take_output(c, out)


def take_output(c: Choice, out: Output) -> None:
    c.tokens += out.tokens
    c.text += out.text or ""
    if out.logprobs is not None and len(out.logprobs):
        c.logprobs.append(out.logprobs)
    if out.prompt_logprobs is not None:
        c.prompt_logprobs = out.prompt_logprobs
    c.last = out

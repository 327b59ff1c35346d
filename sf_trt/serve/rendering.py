"""Responses in OpenAI's shapes: the JSON body of a finished job, and the SSE body
of a streamed one (chunks as outputs come, the usage chunk if asked, ``[DONE]``)."""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator, Optional

from ..abi import Finish
from ..version import __version__
from ..engine import TokenLogprobs
from ..outputs import finish_reason
from .errors import choice_failure
from .jobs import Choice, Job, abort_job, job_outputs, take_output
from .state import ServerState
from .tools import ToolCall, parse_calls

__all__ = ["json_body", "sse_body"]


def _usage(job: Job) -> dict:
    completion = sum(c.last.completion_tokens for c in job.choices if c.last is not None)
    prompt = sum(len(p) for p in job.prompts)
    spec = {
        "num_drafts": sum(c.last.drafts for c in job.choices if c.last),
        "num_draft_tokens": sum(c.last.proposed for c in job.choices if c.last),
        "num_accepted_tokens": sum(c.last.accepted for c in job.choices if c.last),
    }
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": _cached_tokens(job)}, "sf_trt": spec,
    }


def _cached_tokens(job: Job) -> int:
    """Prompt tokens taken from the prefix cache, each prompt counted once (as ``prompt_tokens``):
    the fewest of its choices took (choices admitted together cannot share what none has saved)."""
    fewest: dict[int, int] = {}
    for c in job.choices:
        cached = (c.last.cached_tokens or 0) if c.last is not None else 0
        fewest[c.prompt_index] = min(fewest.get(c.prompt_index, cached), cached)
    return sum(fewest.values())


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


class _TextOffsets:
    """Completions' ``text_offset``: where each token starts in the choice's text, in
    characters. A character whose bytes span several tokens starts at the first of
    them and is counted once (the text is decoded as it streams, special tokens skipped)."""

    def __init__(self, tok: Any, start: int) -> None:
        self.decoder = tok.stream(skip_special=True)
        self.chars = start

    def of(self, tokens: list[int]) -> list[int]:
        out = []
        for t in tokens:
            out.append(self.chars)
            self.chars += len(self.decoder.push(int(t)))
        return out


def _completion_logprobs(tok: Any, tokens: list[int], lp: Optional[TokenLogprobs], offsets: _TextOffsets) -> Optional[dict]:
    if lp is None:
        return None
    strs = [_token_str(tok, t) for t in tokens]
    top = [{_token_str(tok, int(i)): float(v) for i, v in zip(lp.top_ids[j], lp.top_logprobs[j])} for j in range(len(tokens))]
    return {"tokens": strs, "token_logprobs": [float(x) for x in lp.logprob], "top_logprobs": top, "text_offset": offsets.of(tokens)}


def _echo_logprobs(tok: Any, ids: list[int], lp: Optional[TokenLogprobs], k: int) -> dict:
    """The prompt's part of a completion's logprobs under ``echo``: the first token has
    none (null), as in OpenAI's and vLLM's responses."""
    strs = [_token_str(tok, t) for t in ids]
    n = 0 if lp is None else len(lp)
    offsets = _TextOffsets(tok, 0).of(ids)  # in characters, as the output's
    values = [None] + [float(x) for x in lp.logprob[:n]] if lp is not None else [None] * len(ids)
    top = [None] + [{_token_str(tok, int(i)): float(v) for i, v in zip(lp.top_ids[j, :k], lp.top_logprobs[j, :k])} for j in range(n)]
    return {"tokens": strs, "token_logprobs": values[: len(ids)], "top_logprobs": top[: len(ids)], "text_offset": offsets}


def _joined(first: dict, then: Optional[dict]) -> dict:
    """Two completion logprobs objects one after the other."""
    if then is None:
        return first
    return {key: first[key] + then[key] for key in first}


def _vllm_prompt_logprobs(tok: Any, ids: list[int], lp: Optional[TokenLogprobs], k: int) -> Optional[list]:
    """vLLM's ``prompt_logprobs``: per prompt token (null for the first), token id ->
    ``{logprob, rank, decoded_token}`` for the token itself and the top alternatives
    (``rank`` 1 for the most likely; null for a token outside the alternatives)."""
    if lp is None:
        return None
    out: list = [None]
    for j in range(len(lp)):
        entry = {}
        for r, (i, v) in enumerate(zip(lp.top_ids[j, :k].tolist(), lp.top_logprobs[j, :k].tolist())):
            entry[str(i)] = {"logprob": float(v), "rank": r + 1, "decoded_token": _token_str(tok, i)}
        t = ids[j + 1]
        if str(t) not in entry:
            entry = {str(t): {"logprob": float(lp.logprob[j]), "rank": None, "decoded_token": _token_str(tok, t)}, **entry}
        out.append(entry)
    return out


def _lp(c: Choice, k: Optional[int]) -> Optional[TokenLogprobs]:
    return None if k is None else TokenLogprobs.concat(c.logprobs, k)


def _tool_calls(job: Job, c: Choice) -> Optional[tuple[str, list[ToolCall]]]:
    """``(content, calls)`` of a finished choice whose output holds tool calls, or None: no
    tools, no call, or a forced call cut short (it stays text, ``finish_reason: "length"``)."""
    if job.tools is None or c.last is None or (job.tools.call_schema is not None and c.last.finish != Finish.EOS):
        return None
    content, calls = parse_calls(c.text, job.tools)
    return (content, calls) if calls else None


def json_body(state: ServerState, job: Job) -> dict:
    tok = state.tokenizer
    choices = []
    for c in job.choices:
        out = c.last
        item: dict[str, Any] = {"index": c.index}
        call = _tool_calls(job, c)
        if call is not None:
            item["message"] = {"role": "assistant", "content": call[0] or None, "tool_calls": [t.as_json() for t in call[1]]}
            item["logprobs"] = _chat_logprobs(tok, c.tokens, _lp(c, job.logprobs))
        elif job.kind == "chat":
            item["message"] = {"role": "assistant", "content": c.text}
            item["logprobs"] = _chat_logprobs(tok, c.tokens, _lp(c, job.logprobs))
        else:
            echo = job.prompt_texts[c.prompt_index] if job.body.echo else ""
            item["text"] = echo + c.text
            item["logprobs"] = _completion_logprobs(tok, c.tokens, _lp(c, job.logprobs), _TextOffsets(tok, len(echo)))
            if job.body.echo and job.logprobs is not None:
                item["logprobs"] = _joined(_echo_logprobs(tok, job.prompts[c.prompt_index], c.prompt_logprobs, job.logprobs), item["logprobs"])
        if job.body.prompt_logprobs is not None:
            item["prompt_logprobs"] = _vllm_prompt_logprobs(tok, job.prompts[c.prompt_index], c.prompt_logprobs, job.body.prompt_logprobs)
        item["finish_reason"] = "tool_calls" if call is not None else finish_reason(out.finish, out.error)
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


async def sse_body(state: ServerState, job: Job) -> AsyncIterator[str]:
    """The SSE body: chunks as outputs come, the usage chunk if asked, then ``[DONE]``;
    a failed choice ends the stream with an ``error`` event. A client that goes away
    cancels this generator, which aborts the choices still running."""
    tok = state.tokenizer
    chat = job.kind == "chat"
    include_usage = bool(job.body.stream_options and job.body.stream_options.include_usage)
    continuous_usage = include_usage and job.body.stream_options.continuous_usage_stats  # vLLM's: usage so far in every chunk
    base = {"id": job.id, "object": "chat.completion.chunk" if chat else "text_completion", "created": job.created,
            "model": state.model_name, "system_fingerprint": f"sf_trt-{__version__}", "sf_trt": {"seed": job.seed}}
    if include_usage:
        base["usage"] = None

    def chunk(item: dict) -> str:
        if continuous_usage:
            return _sse_data({**base, "choices": [item], "usage": _usage(job)})
        return _sse_data({**base, "choices": [item]})

    finished = False
    outputs = None
    offsets = {c.index: _TextOffsets(tok, 0) for c in job.choices}
    try:
        for c in job.choices:
            if chat:
                yield chunk({"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None})
            elif job.body.echo:
                echo = job.prompt_texts[c.prompt_index]
                offsets[c.index] = _TextOffsets(tok, len(echo))
                if job.logprobs is None:  # else with the choice's first output, which brings the prompt's logprobs
                    yield chunk({"index": c.index, "text": echo, "logprobs": None, "finish_reason": None})
        outputs = job_outputs(job)
        async for c, out in outputs:
            take_output(c, out)
            if out.prompt_logprobs is not None and not chat and (job.body.echo and job.logprobs is not None or job.body.prompt_logprobs is not None):
                ids = job.prompts[c.prompt_index]
                first = {"index": c.index, "text": job.prompt_texts[c.prompt_index] if job.body.echo else "", "finish_reason": None,
                         "logprobs": _echo_logprobs(tok, ids, out.prompt_logprobs, job.logprobs) if job.body.echo and job.logprobs is not None else None}
                if job.body.prompt_logprobs is not None:
                    first["prompt_logprobs"] = _vllm_prompt_logprobs(tok, ids, out.prompt_logprobs, job.body.prompt_logprobs)
                yield chunk(first)
            if out.error is not None:
                abort_job(state, job)
                yield f"event: error\n{_sse_data(choice_failure(c.index, out.error).body())}"
                yield "data: [DONE]\n\n"
                finished = True
                return
            lp = out.logprobs if job.logprobs is not None else None
            if job.tools is None and (out.text or (out.tokens and (lp is not None or job.return_token_ids))):
                if chat:
                    item = {"index": c.index, "delta": {"content": out.text or ""}, "logprobs": _chat_logprobs(tok, out.tokens, lp), "finish_reason": None}
                else:
                    item = {"index": c.index, "text": out.text or "", "finish_reason": None,
                            "logprobs": _completion_logprobs(tok, out.tokens, lp, offsets[c.index])}
                if job.return_token_ids:
                    item["token_ids"] = out.tokens
                yield chunk(item)
            if out.finished:
                call = _tool_calls(job, c)
                if job.tools is not None:  # with tools the text is held back: the calls come whole, parsed, at the end
                    if call is not None:
                        if call[0]:
                            yield chunk({"index": c.index, "delta": {"content": call[0]}, "logprobs": None, "finish_reason": None})
                        delta = {"tool_calls": [t.as_json(index=i) for i, t in enumerate(call[1])]}
                    else:
                        delta = {"content": c.text}
                    yield chunk({"index": c.index, "delta": delta, "logprobs": None, "finish_reason": None})
                reason = "tool_calls" if call is not None else finish_reason(out.finish, out.error)
                end = {"index": c.index, "finish_reason": reason, "stop_reason": out.stop_reason, "logprobs": None}
                end.update({"delta": {}} if chat else {"text": ""})
                if job.return_token_ids:
                    end["token_ids"] = []
                yield chunk(end)
        if include_usage:
            yield _sse_data({**base, "choices": [], "usage": _usage(job)})
        yield "data: [DONE]\n\n"
        finished = True
    finally:
        if not finished and abort_job(state, job):  # first: nothing below may be awaited once cancelled
            state.metrics.client_disconnected()
        if outputs is not None:
            with contextlib.suppress(BaseException):
                await outputs.aclose()

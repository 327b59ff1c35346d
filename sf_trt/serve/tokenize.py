"""``POST /tokenize`` and ``POST /detokenize``: the server's tokenizer, in vLLM's shapes.

``/tokenize`` takes ``{"prompt": TEXT}`` (what ``/v1/completions`` would prefill for
that text) or ``{"messages": [...], "add_generation_prompt": true}`` (what
``/v1/chat/completions`` would), and answers ``{"count", "max_model_len", "tokens",
"token_strs"}`` (``token_strs`` with ``return_token_strs``: each token's text, UTF-8
decoded with U+FFFD for a partial character). ``add_special_tokens`` is accepted:
sf_trt's tokenizers add no special token to a prompt either way, so the ids are
those the generating routes use. ``/detokenize`` takes ``{"tokens": [...]}`` and
answers ``{"prompt": TEXT}`` (special tokens kept). Both check the model like the
generating routes, and a prompt's size against ``--max-prompt-bytes`` (not against the
context: counting a text too long for it is what a harness may want).
"""

from __future__ import annotations

from typing import Optional, Union

from pydantic import Field
from pydantic_core import from_json

from ..abi import Status
from ..tokenizer import TokenizerError
from .errors import ApiError
from .guard import parse_body
from .jobs import check_model, encode_messages, encode_text
from .schemas import ChatMessage, _Strict
from .state import ServerState

__all__ = ["TokenizeCompletionRequest", "TokenizeChatRequest", "DetokenizeRequest", "tokenize", "detokenize"]


class TokenizeCompletionRequest(_Strict):
    model: Optional[str] = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChatRequest(_Strict):
    model: Optional[str] = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    add_special_tokens: bool = False
    return_token_strs: bool = False


class DetokenizeRequest(_Strict):
    model: Optional[str] = None
    tokens: list[int]


def tokenize(state: ServerState, raw: bytes) -> dict:
    """The answer of ``/tokenize`` for the body ``raw`` (call it off the event loop)."""
    state.ready_engine()
    body: Union[TokenizeCompletionRequest, TokenizeChatRequest]
    body = parse_body(TokenizeChatRequest if _has_messages(raw) else TokenizeCompletionRequest, raw)
    check_model(state, body.model)
    if isinstance(body, TokenizeChatRequest):
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        ids = encode_messages(state, messages, add_generation_prompt=body.add_generation_prompt, fit_context=False)
    else:
        ids = encode_text(state, body.prompt, "prompt", fit_context=False)
    strs = [state.tokenizer.token_bytes(t).decode("utf-8", errors="replace") for t in ids] if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": state.max_context, "tokens": ids, "token_strs": strs}


def detokenize(state: ServerState, raw: bytes) -> dict:
    """The answer of ``/detokenize`` for the body ``raw``."""
    state.ready_engine()
    body = parse_body(DetokenizeRequest, raw)
    check_model(state, body.model)
    vocab = state.tokenizer.vocab_size
    bad = [(i, t) for i, t in enumerate(body.tokens) if not 0 <= t < vocab]
    if bad:
        i, t = bad[0]
        raise ApiError(400, Status.TOKEN_OUT_OF_VOCAB.name, f"tokens: token {t} at index {i} is outside the vocabulary 0..{vocab - 1}", "tokens")
    try:
        return {"prompt": state.tokenizer.decode(body.tokens)}
    except TokenizerError as exc:
        raise ApiError(400, Status.TOKEN_OUT_OF_VOCAB.name, f"tokens: {exc}", "tokens") from None


def _has_messages(raw: bytes) -> bool:
    """Whether the body is a chat request (it has ``messages``); a body that is not
    a JSON object is left to :func:`parse_body` to refuse."""
    try:
        obj = from_json(raw)
    except ValueError:
        return False
    return isinstance(obj, dict) and "messages" in obj


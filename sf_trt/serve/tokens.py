"""``/tokenize`` and ``/detokenize`` (vLLM's routes): the server's tokenizer for harnesses
that count or build token-id prompts (lm-eval's ``tokenized_requests``, say). Text and
chat messages are encoded exactly as the completion routes encode them."""

from __future__ import annotations

from ..tokenizer import TokenizerError
from .errors import ApiError
from .schemas import DetokenizeRequest, TokenizeRequest
from .state import ServerState

__all__ = ["tokenize", "detokenize"]


def _check_model(state: ServerState, model) -> None:
    state.ready_engine()
    if model is not None and model != state.model_name:
        raise ApiError(404, "NotFoundError", f"the model {model!r} does not exist (served: {state.model_name!r})", "model")


def tokenize(state: ServerState, body: TokenizeRequest) -> dict:
    _check_model(state, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "BadRequestError", "tokenize: send exactly one of prompt and messages", "prompt")
    try:
        if body.prompt is not None:
            ids = state.tokenizer.encode(body.prompt)
        else:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            ids = state.tokenizer.encode_chat(messages, add_generation_prompt=body.add_generation_prompt)
    except TokenizerError as exc:
        raise ApiError(400, "BadRequestError", str(exc), "prompt" if body.prompt is not None else "messages") from None
    return {"count": len(ids), "max_model_len": state.max_context, "tokens": ids}


def detokenize(state: ServerState, body: DetokenizeRequest) -> dict:
    _check_model(state, body.model)
    try:
        return {"prompt": state.tokenizer.decode(body.tokens)}
    except (TokenizerError, ValueError, IndexError, OverflowError) as exc:
        raise ApiError(400, "BadRequestError", f"tokens: {exc}", "tokens") from None

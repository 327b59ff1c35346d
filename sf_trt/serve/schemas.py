"""Request bodies of the OpenAI-compatible routes (pydantic v2, unknown fields refused).

Every model forbids fields it does not declare (``extra="forbid"``): a misspelt or
unsupported field is a 400 naming it, never silently ignored. Fields the OpenAI API
defines but sf_trt cannot honour yet are declared so that the 400 can say so
(:meth:`SamplingFields.unsupported`): they are accepted only at their no-op values
(no tools). ``response_format`` and vLLM's ``structured_outputs`` / ``guided_*`` are
checked by :mod:`sf_trt.serve.structured`.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..engine import TOP_LOGPROBS_MAX
from ..scheduler import DRAFTERS

__all__ = [
    "SfTrtOptions", "StreamOptions", "SamplingFields", "CompletionRequest", "ChatMessage", "ChatCompletionRequest",
    "SPECULATE_CHOICES", "MAX_N", "TokenizeRequest", "DetokenizeRequest",
]

SPECULATE_CHOICES = ("none", *DRAFTERS)
"""What the ``sf_trt.speculate`` field takes: ``none`` or a drafter's name."""
MAX_N = 16
"""The most choices (``n``) one request may ask for."""
_INT63 = 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SfTrtOptions(_Strict):
    """The ``sf_trt`` extension object (the openai client sends it with ``extra_body``)."""

    speculate: Optional[str] = None
    """``none`` or a drafter (``prompt-lookup``); default: the server's ``--speculate``."""
    max_draft: Optional[int] = Field(None, ge=1, le=256)
    """The most draft tokens per verify pass (default: the server's ``--max-draft``)."""
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token (until ``max_tokens`` or a stop)."""
    return_token_ids: bool = False
    """Add each choice's (and each chunk's) output token ids as ``token_ids``."""

    @field_validator("speculate")
    @classmethod
    def _known_drafter(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and v not in SPECULATE_CHOICES:
            raise ValueError(f"must be one of {list(SPECULATE_CHOICES)} (got {v!r})")
        return v


class StreamOptions(_Strict):
    include_usage: bool = False


class SamplingFields(_Strict):
    """Fields both routes share."""

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=0)
    """0: generate nothing (with ``echo`` and ``logprobs``: score the prompt); completions only."""
    temperature: Optional[float] = Field(None, ge=0.0, allow_inf_nan=False)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    seed: Optional[int] = Field(None, ge=0, le=_INT63)
    n: int = Field(1, ge=1, le=MAX_N)
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    sf_trt: Optional[SfTrtOptions] = None
    # Logit adjustments (vLLM's semantics, exact under speculation: sf_trt.abi.SamplingParams)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    repetition_penalty: Optional[float] = Field(None, gt=0.0, allow_inf_nan=False)
    """vLLM's: > 1 discourages the tokens of the prompt and the output, 1 is off."""
    logit_bias: Optional[dict[str, float]] = None
    """Token id (a string, as JSON keys are) -> bias in [-100, 100], added to its logit."""
    min_tokens: Optional[int] = Field(None, ge=0)
    """vLLM's: no EOS, stop token or stop string ends the output before this many tokens."""
    prompt_logprobs: Optional[int] = Field(None, ge=0, le=TOP_LOGPROBS_MAX)
    """vLLM's: each prompt token's logprob (the first's is null) and this many alternatives."""
    # Output constraints (vLLM's; sf_trt.serve.structured compiles them)
    structured_outputs: Optional[dict[str, Any]] = None
    """vLLM's: one of ``json`` (a schema), ``regex``, ``choice`` (strings), ``grammar`` (Lark/GBNF)."""
    guided_json: Optional[Union[dict[str, Any], str]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None

    def unsupported(self) -> list[str]:
        """The fields set to something sf_trt cannot honour yet, by name."""
        return []

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as ``(token id, bias)`` pairs; a ValueError naming a key that is no token id."""
        pairs = []
        for key, value in (self.logit_bias or {}).items():
            if not key.isdigit() or len(key) > 10:
                raise ValueError(f"logit_bias: key {key[:20]!r} is not a token id (a non-negative integer as a string)")
            pairs.append((int(key), value))
        return tuple(pairs)

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=TOP_LOGPROBS_MAX)
    suffix: Optional[str] = None
    best_of: Optional[int] = None

    def unsupported(self) -> list[str]:
        out = super().unsupported()
        if self.suffix:
            out.append("suffix")
        if self.best_of not in (None, self.n):
            out.append("best_of")
        return out

    def prompts(self) -> list[Union[str, list[int]]]:
        """The prompts, one per entry of a batch."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Optional[Union[str, list[TextPart]]] = None
    name: Optional[str] = None
    refusal: Optional[str] = None
    tool_calls: Optional[list[Any]] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=TOP_LOGPROBS_MAX)
    response_format: Optional[dict[str, Any]] = None
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    functions: Optional[list[Any]] = None
    function_call: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None

    def unsupported(self) -> list[str]:
        out = super().unsupported()
        for name in ("tools", "functions"):
            if getattr(self, name):
                out.append(name)
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none"):
                out.append(name)
        if any(m.tool_calls for m in self.messages):
            out.append("messages[].tool_calls")
        return out


class TokenizeRequest(_Strict):
    """``POST /tokenize`` (vLLM's): a ``prompt`` or chat ``messages`` to token ids, as the
    completion routes would encode them."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    """``POST /detokenize`` (vLLM's): token ids to text."""

    model: Optional[str] = None
    tokens: list[int]

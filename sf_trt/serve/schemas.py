"""Request bodies of the OpenAI-compatible routes (pydantic v2, unknown fields refused).

Every model forbids fields it does not declare (``extra="forbid"``): a misspelt or
unsupported field is a 400 naming it, never silently ignored. Types are strict
(``strict=True``): ``"1"`` is not a number, ``1`` is not a bool, ``1.0`` is not an
int. Fields the OpenAI API defines but sf_trt cannot honour yet are declared so that
the 400 can say so (:meth:`SamplingFields.unsupported`): they are accepted only at
their no-op values (``response_format`` ``{"type": "text"}``, no tools,
``skip_special_tokens`` true). Fields that only annotate a request (``store``,
``metadata``, ``service_tier``, ``user``, ``parallel_tool_calls``) are accepted and
change nothing.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..engine import TOP_LOGPROBS_MAX
from ..scheduler import DRAFTERS
from .limits import TEMPERATURE_MAX

__all__ = [
    "SfTrtOptions", "StreamOptions", "SamplingFields", "CompletionRequest", "ChatMessage", "ChatCompletionRequest",
    "SPECULATE_CHOICES", "MAX_N",
]

SPECULATE_CHOICES = ("none", *DRAFTERS)
"""What the ``sf_trt.speculate`` field takes: ``none`` or a drafter's name."""
MAX_N = 16
"""The most choices (``n``) one request may ask for."""
_INT63 = 2**63 - 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


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
    continuous_usage_stats: bool = False
    """vLLM's: every chunk carries the usage so far (with ``include_usage``, as vLLM)."""


class SamplingFields(_Strict):
    """Fields both routes share."""

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=0)
    """0: generate nothing (with ``echo`` and ``logprobs``: score the prompt); completions only."""
    temperature: Optional[float] = Field(None, ge=0.0, le=TEMPERATURE_MAX, allow_inf_nan=False)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: Optional[int] = Field(None, ge=-1)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    seed: Optional[int] = Field(None, ge=-1, le=_INT63)
    """-1 (vLLM's) or none: the server draws one and returns it."""
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
    ignore_eos: bool = False
    """vLLM's: the same as ``sf_trt.ignore_eos``."""
    skip_special_tokens: bool = True
    """vLLM's: the text leaves special tokens out; sf_trt always does (false is refused)."""
    # Annotations: accepted, change nothing.
    store: Optional[bool] = None
    metadata: Optional[dict[str, str]] = None
    service_tier: Optional[str] = None

    def unsupported(self) -> list[str]:
        """The fields set to something sf_trt cannot honour yet, by name."""
        return [] if self.skip_special_tokens else ["skip_special_tokens"]

    def bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """``logit_bias`` as ``(token id, bias)`` pairs; a ValueError naming a key that is no token id."""
        pairs = []
        for key, value in (self.logit_bias or {}).items():
            if not key.isdigit() or len(key) > 10:
                raise ValueError(f"logit_bias: key {key[:20]!r} is not a token id (a non-negative integer as a string)")
            pairs.append((int(key), value))
        return tuple(pairs)

    @field_validator("seed")
    @classmethod
    def _random_seed(cls, v: Optional[int]) -> Optional[int]:
        return None if v == -1 else v

    @property
    def ignores_eos(self) -> bool:
        return self.ignore_eos or bool(self.sf_trt and self.sf_trt.ignore_eos)

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
        if self.response_format not in (None, {"type": "text"}):
            out.append("response_format")
        for name in ("tools", "functions"):
            if getattr(self, name):
                out.append(name)
        for name in ("tool_choice", "function_call"):
            if getattr(self, name) not in (None, "none"):
                out.append(name)
        if any(m.tool_calls for m in self.messages):
            out.append("messages[].tool_calls")
        return out


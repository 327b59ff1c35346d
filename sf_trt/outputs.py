"""The one outward record of a request: :class:`RequestOutput`.

The scheduler reports what each step added to a sequence; everything above it (the
batch :class:`~sf_trt.generate.Generator`, the serving engine loop, ``sf_trt.LLM``)
hands its callers this one record, in one of two kinds:

* a **delta** (a stream's item): ``tokens``, ``text`` and ``logprobs`` are what one
  step added; counts and times are the request's so far; the last delta of a stream
  has ``finish != Finish.NONE``;
* **cumulative** (a finished request): ``tokens``, ``text`` and ``logprobs`` are the
  whole output.

``text`` is None without a tokenizer; ``logprobs`` None unless the request asked.
``finish`` is ``Finish.ERROR`` when the backend failed for the request, and ``error``
then says which op and why (``tokens`` holds every token drawn before); ``error`` may
also report a failed release after a normal finish, which cut nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from .abi import Finish
from .engine import TokenLogprobs

__all__ = ["RequestOutput", "finish_reason"]


def finish_reason(finish: Finish, error: str | None = None) -> str:
    """OpenAI's ``finish_reason`` for a finish code (``abort`` and ``error`` as vLLM adds)."""
    if error is not None:
        return "error"
    if finish in (Finish.EOS, Finish.STOP):
        return "stop"
    if finish in (Finish.LENGTH, Finish.CONTEXT):
        return "length"
    return "abort"


@dataclasses.dataclass(frozen=True)
class RequestOutput:
    """A request's output, as a delta or cumulative (module docstring).

    ``index``: the request's id where it was submitted (its position in a batch, its
    sequence id in the engine loop). ``prompt_tokens`` / ``completion_tokens``: the
    prompt's length and the tokens emitted so far. ``proposed`` / ``accepted`` /
    ``drafts`` / ``passes``: draft tokens sent and verified, verify passes that
    carried a draft, decode passes. Times are ``time.perf_counter()`` seconds.
    """

    index: int
    tokens: list[int]
    text: Optional[str]
    logprobs: Optional[TokenLogprobs]
    finish: Finish
    stop_reason: Optional[str | int]
    """The stop string or stop token id that ended the output (``finish == Finish.STOP``)."""
    error: Optional[str]
    prompt_tokens: int
    completion_tokens: int
    proposed: int = 0
    accepted: int = 0
    drafts: int = 0
    passes: int = 0
    arrival: float = 0.0
    admitted_at: Optional[float] = None
    first_token_at: Optional[float] = None
    finished_at: Optional[float] = None
    prompt_logprobs: Optional[TokenLogprobs] = None
    """For a request with ``prompt_logprobs``: every prompt token's after the first. A
    stream carries them on its first delta (the prompt is prefilled by then) and on no
    other; a cumulative record always."""
    cached_tokens: Optional[int] = None
    """Prompt tokens taken from the prefix cache, not prefilled (None: the engine keeps no
    prefix cache)."""

    @property
    def finished(self) -> bool:
        return self.finish != Finish.NONE

    @property
    def finish_reason(self) -> Optional[str]:
        """``stop``, ``length``, ``abort`` or ``error`` (:func:`finish_reason`); None while running."""
        return finish_reason(self.finish, self.error) if self.finished else None

    @property
    def seconds(self) -> float:
        """From admission to the finish (the prefill included; 0.0 while running)."""
        return (self.finished_at or 0.0) - (self.admitted_at or 0.0)

    @property
    def first_token_s(self) -> Optional[float]:
        """Seconds from admission to the end of the tick that emitted the first token (the
        prefill and that tick: a tick's tokens arrive together); None when no token came."""
        return None if self.first_token_at is None else self.first_token_at - (self.admitted_at or 0.0)

    @property
    def tokens_per_s(self) -> float:
        """Tokens emitted over :attr:`seconds`."""
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

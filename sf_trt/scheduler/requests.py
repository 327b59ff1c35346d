"""Requests as the scheduler takes them: :class:`Request`, the drafter names requests
use (:data:`DRAFTERS`), the id a drafter kind registers under, and the RNG key of
each choice of a request (:func:`choice_key`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Iterator, Optional, Sequence as Seq

from ..abi import Sampling, SamplingParams, Status, StatusError
from ..drafting import DEFAULT_SCOPE
from ..strategies import KINDS

__all__ = ["Request", "strategy_id", "DRAFTERS", "DEFAULT_DRAFTER", "choice_key"]

def strategy_id(kind: str) -> bytes:
    """The 32-byte id a drafter kind is registered under."""
    return f"sf_trt.{kind}.v1".encode().ljust(32, b"\0")


class _Drafters(Mapping):
    """Drafter names as requests and users spell them (``prompt-lookup``, ``suffix``)
    to their strategy kind (:data:`sf_trt.strategies.KINDS`), read live, so a kind
    registered with ``register_drafter_kind`` is a drafter requests can name.
    ``prompt_lookup`` is read as ``prompt-lookup``."""

    def __getitem__(self, name: str) -> str:
        kind = name.replace("-", "_") if isinstance(name, str) else None
        if kind not in KINDS:
            raise KeyError(name)
        return kind

    def __iter__(self) -> Iterator[str]:
        return (kind.replace("_", "-") for kind in KINDS)

    def __len__(self) -> int:
        return len(KINDS)


DRAFTERS: Mapping = _Drafters()
"""Drafters by the name requests use (``Request.drafter``, the server's ``speculate``)."""

DEFAULT_DRAFTER = "prompt-lookup"


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation: ``prompt_ids`` continued under ``sampling``/``params``.

    ``params.max_tokens`` bounds the output (0: until EOS or the context).
    ``seed`` is the lane's RNG counter base (see :func:`choice_key` for ``n > 1``).
    ``speculate`` turns drafting on with ``drafter`` (a :data:`DRAFTERS` name) drafting
    at most ``max_draft`` tokens per pass (0: the drafter's own cap).
    ``draft_scope``: whose finished requests the suffix drafter may draft from and
    whose corpus this one joins (a tenant; see :mod:`sf_trt.drafting.suffix`), and
    whose cached prefixes it may start from and adds to (:mod:`sf_trt.prefix_cache`,
    when the executor has one); None keeps it private.
    ``stop`` (strings, matched on the decoded text; needs a tokenizer) and
    ``stop_token_ids`` end the output with ``Finish.STOP``; ``logprobs`` asks for each
    token's logprob and that many alternatives (None: none); ``prompt_logprobs`` the
    same for every prompt token after the first, from the prefill's rows.
    ``prompt_only``: score the prompt and generate nothing (the API's ``max_tokens: 0``):
    the lane is released once prefilled, finishing with ``Finish.LENGTH``.
    """

    prompt_ids: Seq[int]
    sampling: Sampling = Sampling.GPU_GREEDY
    params: SamplingParams = SamplingParams()
    seed: int = 0
    speculate: bool = True
    drafter: str = DEFAULT_DRAFTER
    max_draft: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: Optional[int] = None
    draft_scope: Optional[str] = DEFAULT_SCOPE
    prompt_logprobs: Optional[int] = None
    prompt_only: bool = False

    def __post_init__(self) -> None:
        # min_tokens holds the stop token ids back in the sampler: they join params' own, so
        # the request keeps one record of what the lane samples with
        held = set(self.params.stop_token_ids)
        if self.params.min_tokens and not held.issuperset(self.stop_token_ids):
            ids = tuple(sorted(held | set(self.stop_token_ids)))
            object.__setattr__(self, "params", dataclasses.replace(self.params, stop_token_ids=ids))


_MASK64 = 2**64 - 1


def _splitmix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def choice_key(seed: int, index: int) -> int:
    """The RNG counter base of choice ``index`` of a request seeded ``seed`` (both >= 0).

    Choice 0 uses the seed itself, so ``sf-trt generate --seed S`` reproduces it. Choice
    ``i > 0`` uses ``splitmix64(splitmix64(seed) XOR i) >> 1`` (SplitMix64, 64-bit
    wrap-around; ``>> 1`` keeps the key in 0..2**63-1): choices are independent streams,
    and choice 1 of seed 42 is not choice 0 of seed 43 (``seed + i`` would make it so).
    """
    if not 0 <= seed < 2**63 or index < 0:
        raise StatusError(Status.BAD_SAMPLING_PARAMS, f"choice_key: seed must be in 0..2**63-1 and index >= 0 (got {seed}, {index})")
    if index == 0:
        return seed
    return _splitmix64(_splitmix64(seed) ^ index) >> 1

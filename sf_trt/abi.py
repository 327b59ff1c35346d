"""The ABI of sf_trt: status codes, finish codes, sampling modes and parameters.

These names are pinned by ``SPEC.md``: code outside this repository is written
against them. Add members; never rename or renumber one.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from typing import Any, Optional

TEMPERATURE_MIN = 2.0**-16
"""The smallest temperature > 0 a lane may sample at (about 1.5e-5).

The sampler divides float32 logits by the temperature and adds Gumbel noise that
spans about 19 (``g = -log(-log u)`` with ``u`` in ``[2**-24, 1 - 2**-24]``). Below
``2**-16`` a logit of 128 scales past ``2**23``, where float32's step reaches 1: the
noise is rounded away and the draw becomes the argmax with ties broken by token id,
not the distribution asked for; far below it (float32 subnormals, under about
``2**-126``) the scaled logits overflow to inf and the draw is garbage. Temperature
0 under ``GPU_GREEDY`` is the argmax, exactly.
"""
FLOAT32_MAX = float(3.4028234663852886e38)
PENALTY_MAX = 2.0
"""``presence_penalty`` and ``frequency_penalty`` lie in ``[-PENALTY_MAX, PENALTY_MAX]`` (OpenAI's and vLLM's range)."""
REPETITION_PENALTY_RANGE = (2.0**-16, 2.0**16)
"""``repetition_penalty`` lies in this range (1: off). vLLM takes any value > 0; the bounds keep
float32 logits divided or multiplied by it finite on any model whose logits are."""
LOGIT_BIAS_MAX = 100.0
"""A ``logit_bias`` value lies in ``[-LOGIT_BIAS_MAX, LOGIT_BIAS_MAX]`` (OpenAI's range)."""
LOGIT_BIAS_MAX_TOKENS = 1024
"""The most tokens one ``logit_bias`` may name."""
STOP_TOKEN_IDS_MAX = 256
"""The most ``stop_token_ids`` one ``SamplingParams`` may hold."""


TOP_LOGPROBS_MAX = 20
"""The most alternatives a token's logprobs report (OpenAI's ``top_logprobs`` limit)."""


class Status(enum.IntEnum):
    """Why a plan, a prompt or a registration was refused (``OK`` when it was not)."""

    OK = 0
    REGISTRATION_REFUSED = 1
    REJECT_ILLEGAL_COMBINATION = 2
    UNKNOWN_LANE = 3
    LANE_ALREADY_ADMITTED = 4
    UNKNOWN_PROMPT = 5
    EMPTY_PROMPT = 6
    TOKEN_OUT_OF_VOCAB = 7
    PREFILL_OUT_OF_ORDER = 8
    PREFILL_OUT_OF_RANGE = 9
    DECODE_BEFORE_PREFILL = 10
    DECODE_OUT_OF_RANGE = 11
    BAD_SAMPLING_PARAMS = 12
    BAD_SAMPLING_MODE = 13
    CAPACITY_EXHAUSTED = 14
    PROMPT_TOO_LONG = 15
    DUPLICATE_OP = 16
    BAD_ARGUMENT = 17
    UNSUPPORTED = 18
    PREFIX_NOT_CACHED = 19
    """An admit asked for more cached prefix than the prefix cache holds for its prompt."""


class StatusError(Exception):
    """The one exception sf_trt raises for refused input; ``.status`` says why.

    The message names the op and the reason, e.g.
    ``decode(lane=3): lane not admitted (admitted: [1, 2])``.
    """

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = Status(status)

    def __repr__(self) -> str:
        return f"StatusError({self.status.name}, {str(self)!r})"


class Finish(enum.IntEnum):
    """Why a lane stopped emitting (``NONE`` while it still runs)."""

    NONE = 0
    EOS = 1
    LENGTH = 2
    CONTEXT = 3
    """The lane filled the context window (``max_tokens=0`` lets it run that far)."""
    ABORTED = 4
    """The plan released the lane before it finished."""
    ERROR = 5
    """A backend primitive failed for the lane during the tick (``Emit.error`` names
    the op and the exception); every token drawn before the fault was emitted."""
    STOP = 6
    """A stop string or stop token id ended the output. Set by the request layer
    (:mod:`sf_trt.scheduler`), which releases the lane; the executor never emits it."""


class Sampling(enum.IntEnum):
    """How a lane draws its tokens."""

    GPU_GREEDY = 0
    """argmax of the logits; the lowest token id wins ties."""
    GPU_GUMBEL = 1
    """Gumbel-max over the top-k / top-p candidates, keyed by (rng_counter_base, position)."""


class SamplingFlag(enum.IntFlag):
    NONE = 0
    IGNORE_EOS = 1
    """Drawing ``eos`` does not finish the lane."""


class CertMode(enum.IntFlag):
    """Sampling modes a strategy certificate covers."""

    GREEDY = 1
    GUMBEL = 2


class Exactness(enum.IntEnum):
    """What a strategy certificate promises about the tokens a lane emits."""

    DISTRIBUTION_EXACT = 1
    """Token for token what the lane emits without the strategy."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-lane sampling parameters, checked when constructed.

    ``top_k=0`` turns top-k off; ``max_tokens=0`` means no limit but the context.
    ``temperature`` is read only under ``Sampling.GPU_GUMBEL``, where it must be > 0
    (checked at admission, see :meth:`check_for`); it is 0 or in
    ``TEMPERATURE_MIN .. FLOAT32_MAX`` (the sampler's float32 arithmetic, see
    :data:`TEMPERATURE_MIN`). ``min_p`` in [0, 1] keeps the tokens whose probability
    (after temperature) is at least ``min_p`` times the most likely token's (0: off;
    vLLM's and llama.cpp's meaning).

    Logit adjustments, vLLM's semantics and order (all off by default; a lane with none
    costs nothing, see docs/design.md "Penalties"): ``min_tokens`` holds back ``eos``
    (unless ``IGNORE_EOS``) and ``stop_token_ids`` (-inf) until that many tokens were
    emitted; ``logit_bias`` (a mapping token id -> bias in [-100, 100], stored as sorted
    ``(id, bias)`` pairs) is added; ``repetition_penalty`` (1: off) divides the positive and
    multiplies the negative logits of every token in the prompt or the output;
    ``frequency_penalty`` times a token's count in the output and ``presence_penalty``
    (once, if it occurs) are subtracted (output tokens only, both in [-2, 2]). The
    counts at each position are those of the tokens before it, draft tokens included,
    so speculation never changes a token. ``stop_token_ids`` are the ids the request
    layer stops on (:class:`sf_trt.scheduler.Request`); the executor reads them only
    for ``min_tokens``.

    ``grammar``: a :class:`sf_trt.grammar.Grammar` (None: none) the lane's output must
    match: each row's forbidden tokens get -inf, after the adjustments above, and the end
    token is allowed only where the grammar accepts. Not with ``IGNORE_EOS`` nor
    ``min_tokens`` (a grammar that is done allows only the end token).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 0
    flags: SamplingFlag = SamplingFlag(0)
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Any = ()
    min_tokens: int = 0
    stop_token_ids: tuple = ()
    grammar: Any = None

    @property
    def adjusts_logits(self) -> bool:
        """Whether any logit adjustment (penalty, bias, ``min_tokens``, grammar) is on."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0 or self.logit_bias or self.min_tokens
            or self.grammar is not None
        )

    def __post_init__(self) -> None:
        def bad(what: str) -> StatusError:
            return StatusError(Status.BAD_SAMPLING_PARAMS, f"SamplingParams: {what}")

        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(f"{name} must be a number (got {value!r})")
            if math.isnan(value) or math.isinf(value):
                raise bad(f"{name} must be finite (got {value!r})")
        for name in ("top_k", "max_tokens", "min_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(f"{name} must be an int (got {value!r})")
            if value < 0:
                raise bad(f"{name} must be >= 0 (got {value})")
        if self.temperature < 0:
            raise bad(f"temperature must be >= 0 (got {self.temperature})")
        if 0 < self.temperature < TEMPERATURE_MIN:
            raise bad(
                f"temperature {self.temperature!r} is below the floor {TEMPERATURE_MIN!r} (2**-16): float32 cannot hold "
                "the scaled logits and the sampler's noise together; use 0 (GPU_GREEDY) for the argmax"
            )
        if self.temperature > FLOAT32_MAX:
            raise bad(f"temperature {self.temperature!r} is above float32's largest value {FLOAT32_MAX!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise bad(f"top_p must be in (0, 1] (got {self.top_p})")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad(f"min_p must be in [0, 1] (got {self.min_p})")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -PENALTY_MAX <= getattr(self, name) <= PENALTY_MAX:
                raise bad(f"{name} must be in [-{PENALTY_MAX}, {PENALTY_MAX}] (got {getattr(self, name)})")
        lo, hi = REPETITION_PENALTY_RANGE
        if not lo <= self.repetition_penalty <= hi:
            raise bad(f"repetition_penalty must be in [2**-16, 2**16] (1: off) (got {self.repetition_penalty})")
        if self.max_tokens and self.min_tokens > self.max_tokens:
            raise bad(f"min_tokens {self.min_tokens} exceeds max_tokens {self.max_tokens}")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias, bad))
        object.__setattr__(self, "stop_token_ids", _token_ids(self.stop_token_ids, "stop_token_ids", bad))
        known = SamplingFlag.IGNORE_EOS
        if isinstance(self.flags, bool) or not isinstance(self.flags, int) or self.flags & ~int(known):
            raise bad(f"unknown flags {self.flags!r} (known: {[f.name for f in SamplingFlag if f]})")
        object.__setattr__(self, "flags", SamplingFlag(self.flags))
        if self.grammar is not None:
            if not (hasattr(self.grammar, "table") and hasattr(self.grammar, "text")):
                raise bad(f"grammar must be an sf_trt.grammar.Grammar (got {type(self.grammar).__name__})")
            if self.flags & SamplingFlag.IGNORE_EOS:
                raise bad("grammar and IGNORE_EOS do not combine (a finished grammar allows only the end token)")
            if self.min_tokens:
                raise bad(f"grammar and min_tokens ({self.min_tokens}) do not combine (the grammar decides where the output "
                          "ends; holding the end token back could leave no token to draw)")

    def check_for(self, mode: Sampling, *, top_k_limit: int, vocab: Optional[int] = None) -> str | None:
        """The reason these parameters cannot be used under ``mode`` (and, given ``vocab``,
        on a model of that vocabulary), or None."""
        if mode == Sampling.GPU_GUMBEL and self.temperature <= 0:
            return f"temperature must be > 0 under GPU_GUMBEL (got {self.temperature}); use GPU_GREEDY for argmax"
        if self.top_k > top_k_limit:
            return f"top_k {self.top_k} exceeds the sampler's limit {top_k_limit}"
        if vocab is not None:
            for name, ids in (("logit_bias", [t for t, _ in self.logit_bias]), ("stop_token_ids", self.stop_token_ids)):
                out = [t for t in ids if t >= vocab]
                if out:
                    return f"{name}: token ids {out[:4]} outside the vocabulary 0..{vocab - 1}"
            if self.grammar is not None and self.grammar.vocab != vocab:
                return f"grammar: built for a vocabulary of {self.grammar.vocab}, the model has {vocab}"
        return None


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31


def _token_ids(ids: Any, name: str, bad) -> tuple:
    """``ids`` as a tuple of token ids (ints in 0..2**31-1)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
        raise bad(f"{name} must be a list of token ids (got {type(ids).__name__})")
    if len(ids) > STOP_TOKEN_IDS_MAX:
        raise bad(f"{name} holds {len(ids)} ids, at most {STOP_TOKEN_IDS_MAX}")
    wrong = [t for t in ids if not _token_id(t)]
    if wrong:
        raise bad(f"{name} must hold token ids, ints >= 0 (got {wrong[:4]!r})")
    return tuple(int(t) for t in ids)


def _bias_pairs(bias: Any, bad) -> tuple:
    """``logit_bias`` (a mapping or ``(id, bias)`` pairs) as sorted ``(id, float bias)`` pairs."""
    items = bias.items() if isinstance(bias, Mapping) else bias
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple, type({}.items()))):
        raise bad(f"logit_bias must map token ids to biases (got {type(bias).__name__})")
    pairs = {}
    for pair in items:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise bad(f"logit_bias must map token ids to biases (got the entry {pair!r})")
        token, value = pair
        if not _token_id(token):
            raise bad(f"logit_bias keys must be token ids, ints >= 0 (got {token!r})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -LOGIT_BIAS_MAX <= value <= LOGIT_BIAS_MAX:
            raise bad(f"logit_bias[{token}] must be a number in [-{LOGIT_BIAS_MAX:g}, {LOGIT_BIAS_MAX:g}] (got {value!r})")
        if token in pairs:
            raise bad(f"logit_bias names token {token} twice")
        pairs[int(token)] = float(value)
    if len(pairs) > LOGIT_BIAS_MAX_TOKENS:
        raise bad(f"logit_bias names {len(pairs)} tokens, at most {LOGIT_BIAS_MAX_TOKENS}")
    return tuple(sorted(pairs.items()))

"""The ABI of sf_trt: status codes, finish codes, sampling modes and parameters.

These names are pinned by ``SPEC.md``: code outside this repository is written
against them. Add members; never rename or renumber one.
"""

from __future__ import annotations

import dataclasses
import enum
import math

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
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 0
    flags: SamplingFlag = SamplingFlag(0)
    min_p: float = 0.0

    def __post_init__(self) -> None:
        def bad(what: str) -> StatusError:
            return StatusError(Status.BAD_SAMPLING_PARAMS, f"SamplingParams: {what}")

        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise bad(f"{name} must be a number (got {value!r})")
            if math.isnan(value) or math.isinf(value):
                raise bad(f"{name} must be finite (got {value!r})")
        for name in ("top_k", "max_tokens"):
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
        known = SamplingFlag.IGNORE_EOS
        if isinstance(self.flags, bool) or not isinstance(self.flags, int) or self.flags & ~int(known):
            raise bad(f"unknown flags {self.flags!r} (known: {[f.name for f in SamplingFlag if f]})")
        object.__setattr__(self, "flags", SamplingFlag(self.flags))

    def check_for(self, mode: Sampling, *, top_k_limit: int) -> str | None:
        """The reason these parameters cannot be used under ``mode``, or None."""
        if mode == Sampling.GPU_GUMBEL and self.temperature <= 0:
            return f"temperature must be > 0 under GPU_GUMBEL (got {self.temperature}); use GPU_GREEDY for argmax"
        if self.top_k > top_k_limit:
            return f"top_k {self.top_k} exceeds the sampler's limit {top_k_limit}"
        return None

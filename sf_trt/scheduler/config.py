"""How the scheduler runs: :class:`SchedulerConfig`, each default stated once.

Two paths run the scheduler, and they differ on purpose in three settings:

====================  =====================  =========================================
setting               batch (``SchedulerConfig()``)  serving (``SchedulerConfig.serving()``)
====================  =====================  =========================================
``tick_tokens``       16                     8: streamed tokens reach clients sooner
``prefill_budget``    None (no bound)        512: a long prompt cannot stall the streams
                                             of running requests for a whole tick
``first_token_tick``  False                  True: a request's first token streams one
                                             pass after its prefill, not ``tick_tokens``
                                             passes after (that tick drafts nothing)
====================  =====================  =========================================

The batch profile is the Generator's, ``sf_trt.LLM``'s and ``sf-trt generate`` /
``bench``'s (``sf-trt generate`` turns ``first_token_tick`` on when it streams); the serving profile is the engine loop's (``sf-trt serve``). Neither
changes a token: they decide when a lane runs and how much it is asked for.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..abi import Status, StatusError
from ..strategies import KINDS
from .policy import DraftPolicy, LoadAwareDrafting

__all__ = ["SchedulerConfig", "SERVING_TICK_TOKENS", "SERVING_PREFILL_BUDGET", "SERVING_FIRST_TOKEN_TICK"]

SERVING_TICK_TOKENS = 8
"""The serving profile's tokens per decoding lane per tick (module docstring)."""
SERVING_PREFILL_BUDGET = 512
"""The serving profile's prompt tokens prefilled per tick, over all lanes."""
SERVING_FIRST_TOKEN_TICK = True
"""Whether the serving profile gives a request's first token a tick of one pass."""


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """What the scheduler is asked to do each tick (frozen, checked when made).

    ``tick_tokens``: tokens each decoding lane is asked for per tick (>= 1);
    ``prefill_chunk``: prompt tokens a lane prefills per tick (>= 1);
    ``prefill_budget``: prompt tokens prefilled per tick over all lanes (None: no bound);
    ``first_token_tick``: while a decoding lane's first token is due (its prompt just
    prefilled), the tick is one pass without drafts for every lane, so that token is reported
    as soon as it is drawn (time to first token: the prefill and one pass);
    ``draft_config``: drafter kinds' configurations, one per kind (a config or a
    sequence of them; kinds not named keep their defaults); ``policy``: the drafting
    policy (:class:`LoadAwareDrafting` unless given; :class:`DraftPolicy` drafts
    whenever the drafter finds a draft). Refusals are StatusError ``BAD_ARGUMENT``.
    """

    tick_tokens: int = 16
    prefill_chunk: int = 256
    prefill_budget: Optional[int] = None
    first_token_tick: bool = False
    draft_config: Any = ()
    policy: DraftPolicy = dataclasses.field(default_factory=LoadAwareDrafting)

    def __post_init__(self) -> None:
        for name in ("tick_tokens", "prefill_chunk", "prefill_budget"):
            value = getattr(self, name)
            if name == "prefill_budget" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StatusError(Status.BAD_ARGUMENT, f"SchedulerConfig: {name} must be an int >= 1 (got {value!r})")
        if not isinstance(self.first_token_tick, bool):
            raise StatusError(Status.BAD_ARGUMENT, f"SchedulerConfig: first_token_tick must be a bool (got {self.first_token_tick!r})")
        configs = self.draft_config
        configs = tuple(configs) if isinstance(configs, (list, tuple)) else () if configs is None else (configs,)
        for config in configs:
            if self._kind_of(config) is None:
                raise StatusError(
                    Status.BAD_ARGUMENT,
                    f"SchedulerConfig: draft_config {type(config).__name__} is no drafter kind's config (kinds: {sorted(KINDS)})",
                )
        object.__setattr__(self, "draft_config", configs)
        if self.policy is None:
            object.__setattr__(self, "policy", LoadAwareDrafting())
        if not isinstance(self.policy, DraftPolicy):
            raise StatusError(Status.BAD_ARGUMENT, f"SchedulerConfig: policy must be a DraftPolicy (got {type(self.policy).__name__})")

    @staticmethod
    def _kind_of(config: Any) -> Optional[str]:
        return next((name for name, k in KINDS.items() if isinstance(config, k.config_type)), None)

    @property
    def draft_configs(self) -> dict[str, Any]:
        """Each named drafter kind's configuration, by kind."""
        return {self._kind_of(c): c for c in self.draft_config}

    @classmethod
    def serving(cls, **overrides: Any) -> "SchedulerConfig":
        """The engine loop's profile (module docstring), with ``overrides``."""
        return cls(**{"tick_tokens": SERVING_TICK_TOKENS, "prefill_budget": SERVING_PREFILL_BUDGET,
                      "first_token_tick": SERVING_FIRST_TOKEN_TICK, **overrides})

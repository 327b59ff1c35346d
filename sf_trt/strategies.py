"""Speculation strategies: what each needs from the primitives, and what it certifies.

A strategy is registered once per executor; registration checks the backend's
capabilities and grants a *slot* (never 0: slot 0 means "no strategy") with the
certificates that say how exact the strategy is. Lanes name the slot at admission.

Every strategy kind is a *drafter* (:class:`~sf_trt.drafting.Drafter`) whose
drafts the executor verifies row by row, so every kind needs the same two
capabilities (logit rows at every position, rollback to any prefix) and earns the
same certificate: ``DISTRIBUTION_EXACT`` under greedy and Gumbel sampling. That
promise comes from verification, not from the drafter, so
:func:`register_drafter_kind` grants it to every kind the same way; a kind only
says how its config is typed and how a lane's drafter (and any state its lanes
share, such as the suffix corpus) is made.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from .abi import CertMode, Exactness, Sampling, Status, StatusError
from .drafting import Drafter, PromptLookupConfig, PromptLookupDrafter, SuffixConfig, SuffixCorpus, SuffixDrafter
from .primitives import Capabilities

ID_BYTES = 32


@dataclasses.dataclass(frozen=True)
class Certificate:
    """A strategy's promise: ``exactness`` under the ``sampling_modes`` it covers."""

    strategy_id: bytes
    exactness: Exactness
    sampling_modes: CertMode

    def covers(self, mode: Sampling) -> bool:
        needed = CertMode.GREEDY if mode == Sampling.GPU_GREEDY else CertMode.GUMBEL
        return bool(self.sampling_modes & needed)


MakeDrafter = Callable[[Any, Any, list[int], Optional[str]], Drafter]
"""``(config, shared, tokens, scope) -> Drafter``: a lane's drafter over its prompt."""


@dataclasses.dataclass(frozen=True)
class StrategyKind:
    """A kind of strategy: what it requires of the backend, what it certifies, and
    how its lanes' drafters are made."""

    name: str
    needs_verify_rows: bool
    needs_truncate_partial: bool
    exactness: Exactness
    sampling_modes: CertMode
    config_type: type
    make_drafter: MakeDrafter
    make_shared: Callable[[Any], Any]
    """``config -> state`` shared by the lanes of one grant (None: nothing shared)."""

    def default_config(self) -> Any:
        return self.config_type()


KINDS: dict[str, StrategyKind] = {}


def register_drafter_kind(
    name: str,
    config_type: type,
    make_drafter: MakeDrafter,
    make_shared: Callable[[Any], Any] = lambda config: None,
) -> StrategyKind:
    """Add a drafter kind; the executor verifies its drafts, so it is certified
    DISTRIBUTION_EXACT for GREEDY | GUMBEL like every other."""
    if name in KINDS:
        raise StatusError(Status.REGISTRATION_REFUSED, f"register_drafter_kind({name!r}): the name is taken (kinds: {sorted(KINDS)})")
    kind = StrategyKind(
        name=name, needs_verify_rows=True, needs_truncate_partial=True,
        exactness=Exactness.DISTRIBUTION_EXACT, sampling_modes=CertMode.GREEDY | CertMode.GUMBEL,
        config_type=config_type, make_drafter=make_drafter, make_shared=make_shared,
    )
    KINDS[name] = kind
    return kind


register_drafter_kind(
    "prompt_lookup", PromptLookupConfig,
    lambda config, shared, tokens, scope: PromptLookupDrafter(config, tokens),
)
register_drafter_kind(
    "suffix", SuffixConfig,
    lambda config, corpus, tokens, scope: SuffixDrafter(config, tokens, corpus, scope),
    make_shared=SuffixCorpus,
)


@dataclasses.dataclass(frozen=True)
class Grant:
    """A registered strategy, held by the executor under ``slot``."""

    slot: int
    kind: StrategyKind
    strategy_id: bytes
    config_digest: bytes
    kernel_capability: int
    config: Any
    certs: tuple[Certificate, ...]
    shared: Any = None
    """State the grant's lanes share (the suffix corpus), made by the kind."""

    def covers(self, mode: Sampling) -> bool:
        return any(c.covers(mode) for c in self.certs)

    def new_drafter(self, tokens: list[int], scope: Optional[str]) -> Drafter:
        """A drafter for a lane admitted with this grant, over its prompt ``tokens``."""
        return self.kind.make_drafter(self.config, self.shared, tokens, scope)


def make_grant(
    slot: int,
    kind_name: str,
    caps: Capabilities,
    strategy_id: bytes,
    config_digest: bytes,
    kernel_capability: int,
    config: Any = None,
) -> Grant:
    """Check a registration against the backend; the grant, or REGISTRATION_REFUSED."""
    op = f"register_strategy({kind_name})"

    def refuse(why: str) -> StatusError:
        return StatusError(Status.REGISTRATION_REFUSED, f"{op}: {why}")

    kind = KINDS.get(kind_name)
    if kind is None:
        raise refuse(f"unknown strategy kind (known: {sorted(KINDS)})")
    for name, value in (("strategy_id", strategy_id), ("config_digest", config_digest)):
        if not isinstance(value, (bytes, bytearray)) or len(value) != ID_BYTES:
            raise refuse(f"{name} must be {ID_BYTES} bytes (got {type(value).__name__} of length {len(value) if hasattr(value, '__len__') else '?'})")
    if isinstance(kernel_capability, bool) or not isinstance(kernel_capability, int) or kernel_capability < 0:
        raise refuse(f"kernel_capability must be a non-negative int bitmask (got {kernel_capability!r})")
    if kind.needs_verify_rows and not caps.verify_rows:
        raise refuse("the backend cannot produce logit rows at every position of a pass (verify_rows=False)")
    if kind.needs_truncate_partial and not caps.truncate_partial:
        raise refuse("the backend cannot roll its state back to any prefix (truncate_partial=False)")
    missing = kernel_capability & ~caps.kernel_capabilities
    if missing:
        raise refuse(
            f"kernel capability {kernel_capability:#x} asked for, the backend offers {caps.kernel_capabilities:#x} (missing {missing:#x})"
        )
    if config is None:
        config = kind.default_config()
    elif not isinstance(config, kind.config_type):
        raise refuse(f"config must be a {kind.config_type.__name__} (got {type(config).__name__})")
    cert = Certificate(bytes(strategy_id), kind.exactness, kind.sampling_modes)
    return Grant(slot, kind, bytes(strategy_id), bytes(config_digest), kernel_capability, config, (cert,), kind.make_shared(config))

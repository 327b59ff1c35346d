"""Speculation strategies: what each needs from the primitives, and what it certifies.

A strategy is registered once per executor; registration checks the backend's
capabilities and grants a *slot* (never 0: slot 0 means "no strategy") with the
certificates that say how exact the strategy is. Lanes name the slot at admission.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .abi import CertMode, Exactness, Sampling, Status, StatusError
from .drafting import PromptLookupConfig
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


@dataclasses.dataclass(frozen=True)
class StrategyKind:
    """A kind of strategy: what it requires of the backend and how its config is made."""

    name: str
    needs_verify_rows: bool
    needs_truncate_partial: bool
    exactness: Exactness
    sampling_modes: CertMode
    default_config: Callable[[], Any]
    config_type: type


KINDS: dict[str, StrategyKind] = {
    "prompt_lookup": StrategyKind(
        name="prompt_lookup",
        needs_verify_rows=True,
        needs_truncate_partial=True,
        exactness=Exactness.DISTRIBUTION_EXACT,
        sampling_modes=CertMode.GREEDY | CertMode.GUMBEL,
        default_config=PromptLookupConfig,
        config_type=PromptLookupConfig,
    ),
}


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

    def covers(self, mode: Sampling) -> bool:
        return any(c.covers(mode) for c in self.certs)


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
    return Grant(slot, kind, bytes(strategy_id), bytes(config_digest), kernel_capability, config, (cert,))

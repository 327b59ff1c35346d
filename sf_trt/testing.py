"""Test support: a harness over an engine, and the registration helper the seed uses.

The harness checks the executor's invariants after every tick, and checks that a
refused tick changed nothing (SPEC behaviour 1) before returning its Status.
"""

from __future__ import annotations

from typing import Any, Sequence

from .abi import Status, StatusError
from .drafting import PromptLookupConfig
from .engine import Events, Plan, TokenRef
from .strategies import Certificate

__all__ = ["Harness", "register_prompt_lookup_with", "register_drafter_with"]


class Harness:
    """Drives one engine (an :class:`~sf_trt.executor.Executor`) tick by tick."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    @classmethod
    def with_engine(cls, engine: Any) -> "Harness":
        return cls(engine)

    def prompt(self, tokens: Sequence[int]) -> int:
        """Register a prompt; the id ``Plan.admit`` takes."""
        return self.engine.register_prompt(list(tokens))

    def plan(self) -> Plan:
        return Plan()

    def tick_ok(self, plan: Plan) -> Events:
        """Run a tick that must be accepted (a refusal raises its StatusError)."""
        events = self.engine.tick(plan)
        self.engine.check_integrity()
        return events

    def tick_err(self, plan: Plan) -> Status:
        """Run a tick that must be refused; its Status. Checks it changed nothing."""
        before = self.engine.snapshot()
        try:
            self.engine.tick(plan)
        except StatusError as err:
            after = self.engine.snapshot()
            if after != before:
                raise AssertionError(f"the refused tick ({err}) changed the engine's state") from err
            self.engine.check_integrity()
            self.last_error = err
            return err.status
        raise AssertionError(f"the tick was accepted: {plan!r}")

    def rings_tokens(self, token_ref: TokenRef) -> list[int]:
        return self.engine.read_tokens(token_ref)


def register_prompt_lookup_with(
    h: Harness,
    strategy_id: bytes,
    config_digest: bytes,
    kernel_capability: int,
    config: PromptLookupConfig | None = None,
) -> tuple[int, list[Certificate]]:
    """Register prompt lookup on the harness's engine: ``(slot, certs)``.

    Raises :class:`StatusError` with ``REGISTRATION_REFUSED`` when the backend
    cannot verify rows, cannot roll back to a prefix, or lacks the capability.
    """
    return register_drafter_with(h, "prompt_lookup", strategy_id, config_digest, kernel_capability, config)


def register_drafter_with(
    h: Harness,
    kind: str,
    strategy_id: bytes,
    config_digest: bytes,
    kernel_capability: int,
    config: Any = None,
) -> tuple[int, list[Certificate]]:
    """Register a drafter kind (``"prompt_lookup"``, ``"suffix"``) on the harness's engine: ``(slot, certs)``."""
    return h.engine.register_strategy(kind, bytes(strategy_id), bytes(config_digest), kernel_capability, config)

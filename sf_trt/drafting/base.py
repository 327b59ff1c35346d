"""What every drafter is: the protocol the executor drives, and the adaptive draft cap.

A drafter proposes tokens; the executor verifies them against the model's own
draws and keeps only the matching prefix (see :mod:`sf_trt.executor`). So a
drafter decides how fast a lane goes, never what it emits: every drafter kind is
certified ``DISTRIBUTION_EXACT`` by the same registration
(:func:`sf_trt.strategies.register_drafter_kind`), whatever it proposes.
"""

from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable

from ..abi import Status, StatusError


@runtime_checkable
class Drafter(Protocol):
    """One lane's drafter, driven by the executor once per decode step.

    Call order: ``extend(prompt)`` at admission, then per step ``propose`` (at
    most once), ``extend(emitted)``, ``observe(proposed, accepted)``; ``retire()``
    once when the lane is released. Costs, whatever the history length:
    ``extend`` O(1) amortized per token, ``propose`` O(k) for k tokens returned.
    """

    @property
    def history_len(self) -> int:
        """Tokens extended so far (the executor checks it equals the lane's tokens)."""
        ...

    @property
    def draft_cap(self) -> int:
        """The most tokens the next ``propose`` may return (the executor caps by it too)."""
        ...

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens the lane committed (prompt, then accepted and drawn tokens)."""
        ...

    def propose(self, max_len: int) -> list[int]:
        """Up to ``max_len`` tokens that may follow the history; [] to skip drafting."""
        ...

    def observe(self, proposed: int, accepted: int) -> None:
        """How much of the last proposal the model took (0 <= accepted <= proposed)."""
        ...

    def retire(self) -> None:
        """The lane was released: hand its text to whatever outlives it (or nothing)."""
        ...


def check_draft_config(owner: str, max_draft: int, max_backoff: int) -> None:
    """Refuse draft lengths and back-offs out of range (REGISTRATION_REFUSED)."""
    if isinstance(max_draft, bool) or not isinstance(max_draft, int) or not 1 <= max_draft <= 256:
        raise StatusError(Status.REGISTRATION_REFUSED, f"{owner}: max_draft must be an int in 1..256 (got {max_draft!r})")
    if isinstance(max_backoff, bool) or not isinstance(max_backoff, int) or not 0 <= max_backoff <= 64:
        raise StatusError(Status.REGISTRATION_REFUSED, f"{owner}: max_backoff must be an int in 0..64 (got {max_backoff!r})")


class DraftCap:
    """A lane's draft length, adapted to measured acceptance.

    With ``adaptive``: after a rejection the next cap is ``accepted + 1`` (with
    ``gentle``: half the cap, not below that); after a fully accepted draft it
    doubles (up to ``max_draft``); after drafts rejected outright the lane skips
    drafting for 1, 2, 4 .. ``max_backoff`` steps, until a draft is taken again. A
    lane whose text does not repeat stops paying for verify rows it never uses.
    ``gentle`` suits drafters whose drafts carry their own odds (suffix): those
    already end where a continuation becomes unlikely.
    """

    __slots__ = ("max_draft", "adaptive", "max_backoff", "gentle", "cap", "_misses", "_cooldown")

    def __init__(self, max_draft: int, adaptive: bool = True, max_backoff: int = 4, gentle: bool = False) -> None:
        self.max_draft = max_draft
        self.adaptive = adaptive
        self.max_backoff = max_backoff
        self.gentle = gentle
        self.cap = max_draft
        self._misses = 0  # drafts in a row rejected outright
        self._cooldown = 0  # steps left without drafting

    def backing_off(self) -> bool:
        """True while the lane skips drafting after misses; each call uses one step."""
        if self._cooldown:
            self._cooldown -= 1
            return True
        return False

    def observe(self, proposed: int, accepted: int) -> None:
        if not self.adaptive or proposed == 0:
            return
        if accepted >= proposed:
            self.cap = min(self.max_draft, max(1, self.cap) * 2)
        else:
            self.cap = max(accepted + 1, self.cap // 2 if self.gentle else 1)
        if accepted == 0:
            self._misses += 1
            self._cooldown = min(self.max_backoff, 1 << min(self._misses - 1, 16))
        else:
            self._misses = 0


class DrafterBase:
    """What drafters share: the tokens they were extended with (``_history``) and
    the :class:`DraftCap` that adapts their draft length (``_cap``)."""

    __slots__ = ("_history", "_cap")

    @property
    def history_len(self) -> int:
        return len(self._history)

    @property
    def draft_cap(self) -> int:
        return self._cap.cap

    def observe(self, proposed: int, accepted: int) -> None:
        """Adapt the draft cap to how much of the last draft was taken."""
        self._cap.observe(proposed, accepted)

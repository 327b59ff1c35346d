"""Prompt-lookup drafting: propose what followed the latest earlier match of the suffix.

The drafter keeps, for every n-gram size ``n_min .. n_max``, a dict from the
n-gram to the position of its latest *end* strictly before the history's last
position. Appending a token adds one n-gram per size (O(n_max) work), and a
proposal is at most ``n_max`` dict lookups plus the slice it returns: drafting
costs O(1) amortized per token at any history length, never a rescan.

Defaults follow the established engines' n-gram speculators (vLLM's
``prompt_lookup_max``/``prompt_lookup_min``, TensorRT-LLM's
``max_matching_ngram_size``): n-grams of 4 down to 1 tokens, drafts of up to 8.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable

from ..abi import Status, StatusError
from .base import DraftCap, DrafterBase, check_draft_config


@dataclasses.dataclass(frozen=True)
class PromptLookupConfig:
    """How prompt lookup drafts.

    ``ngram_max``/``ngram_min``: the suffix sizes tried, longest first.
    ``max_draft``: the most draft tokens a lane sends for verification in one pass.
    ``adaptive``/``max_backoff``: adapt the draft length to acceptance, and back
    off after drafts rejected outright (:class:`~sf_trt.drafting.base.DraftCap`).
    """

    ngram_max: int = 4
    ngram_min: int = 1
    max_draft: int = 8
    adaptive: bool = True
    max_backoff: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max <= 64:
            raise StatusError(
                Status.REGISTRATION_REFUSED,
                f"PromptLookupConfig: need 1 <= ngram_min <= ngram_max <= 64 (got {self.ngram_min}, {self.ngram_max})",
            )
        check_draft_config("PromptLookupConfig", self.max_draft, self.max_backoff)


class PromptLookupDrafter(DrafterBase):
    """An incremental n-gram index over one lane's history (prompt and output)."""

    __slots__ = ("_cfg", "_latest_end")

    def __init__(self, cfg: PromptLookupConfig, history: Iterable[int] = ()) -> None:
        self._cfg = cfg
        self._history: list[int] = []
        # _latest_end[n - n_min][ngram] = e: history[e-n+1 .. e] == ngram, e <= len - 2.
        self._latest_end: list[dict[tuple[int, ...], int]] = [{} for _ in range(cfg.ngram_min, cfg.ngram_max + 1)]
        self._cap = DraftCap(cfg.max_draft, cfg.adaptive, cfg.max_backoff)
        self.extend(history)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens to the history, indexing the n-grams that become 'earlier'."""
        h = self._history
        n_min = self._cfg.ngram_min
        for tok in tokens:
            # The old last position becomes an earlier end once `tok` follows it.
            end = len(h) - 1
            h.append(int(tok))
            if end < 0:
                continue
            for i, index in enumerate(self._latest_end):
                n = n_min + i
                if end + 1 < n:
                    break
                index[tuple(h[end - n + 1 : end + 1])] = end

    def propose(self, max_len: int) -> list[int]:
        """Up to ``max_len`` tokens that followed the latest earlier occurrence of
        the longest matching suffix (``ngram_max`` down to ``ngram_min``); [] if none."""
        h = self._history
        if max_len <= 0 or not h:
            return []
        if self._cap.backing_off():  # one call per decode step
            return []
        n_min = self._cfg.ngram_min
        for i in range(len(self._latest_end) - 1, -1, -1):
            n = n_min + i
            if n > len(h):
                continue
            end = self._latest_end[i].get(tuple(h[-n:]))
            if end is not None:
                return h[end + 1 : end + 1 + max_len]
        return []

    def retire(self) -> None:
        """Nothing outlives a prompt-lookup lane."""

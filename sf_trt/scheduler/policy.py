"""The drafting policy: what each decoding lane is asked for in a tick, and how long
its drafts may be (:class:`DraftPolicy`, :class:`LoadAwareDrafting`)."""

from __future__ import annotations

import dataclasses
from typing import Optional

from ..abi import Status, StatusError
from .sequence import Sequence

__all__ = ["DraftPolicy", "LoadAwareDrafting"]

class DraftPolicy:
    """Decides, each tick, what every decoding lane is asked for: ``(tokens, max_draft)``
    (``Decode.n`` and ``Decode.max_draft``: None leaves the draft length to the drafter,
    0 turns drafting off). The base class asks every lane for ``tick_tokens`` and lets
    lanes that speculate draft as their drafter likes, whatever the batch (tests and
    benchmarks that must see drafts use it; the default is :class:`LoadAwareDrafting`)."""

    def plan(self, seqs: list[Sequence], tick_tokens: int) -> dict[int, tuple[int, Optional[int]]]:
        return {seq.seq_id: (tick_tokens, None) for seq in seqs}


@dataclasses.dataclass
class LoadAwareDrafting(DraftPolicy):
    """Drafts only while it pays: sheds drafting when the batch is large or a lane's
    drafts are rarely taken, so speculation does not make decoding slower than plain.
    The default of :class:`~sf_trt.generate.Generator` and the serving engine loop.

    On a CPU a verify row costs real compute, and a pass pads every lane to the
    longest one's rows, so one lane's draft makes the whole batch's pass dearer.
    Measured on the decoder (docs/benchmarks.md, ``tools/bench_rows.py``), one more
    row per lane costs about 0.06-0.23 of a pass at 1 lane, 0.17-0.29 at 4 and 0.5 at
    8: modelled as ``row_cost * B / (B + row_cost_lanes)`` passes. The policy, each tick, with ``B`` decoding
    lanes:

    * **row budget**: a lane drafts at most ``k = row_budget // B - 1`` tokens per
      pass; from ``B >= row_budget / 2`` on, ``k = 0`` and nobody drafts
      (TensorRT-LLM turns n-gram drafting off above a concurrency, too);
    * **probes**: a lane that has not drafted yet, or not for ``probe_every`` of its
      ticks, drafts this tick (within the row budget), so a new request starts
      drafting at once and a lane's estimates stay current;
    * **acceptance**: otherwise a lane drafts only if the share of its recent draft
      tokens that were accepted (:attr:`Sequence.acceptance`) reaches the row cost at
      ``B`` (and ``min_acceptance``): alone, a draft token costs about
      ``row_cost_at(1)`` of a pass and saves a pass when taken;
    * **gain against cost**: with more than one lane, they draft this tick only if
      the tokens drafts added per pass, as a share of the batch (the sum over the
      speculating lanes that have drafted of each one's moving tokens-per-pass minus
      one, over ``B``), reach what the padding costs the batch (the row cost at ``B``
      times the most draft tokens one of them sent per pass); drafts that propose
      nothing cost nothing;
    * **balanced ticks**: a tick lasts until its slowest lane has its tokens, so a
      lane whose drafts are taken would finish early and sit idle; a drafting lane
      is asked for ``tick_tokens`` times its tokens-per-pass instead, so every lane
      needs about ``tick_tokens`` passes and the batch, not one lane, goes faster.

    Tokens and draft rows per pass are moving averages that halve toward each tick's
    value; acceptance fades by :data:`ACCEPTANCE_DECAY`. A draft never changes a token,
    so the policy changes speed only.
    """

    row_budget: int = 8
    row_cost: float = 0.6
    row_cost_lanes: float = 4.0
    min_acceptance: float = 0.1
    probe_every: int = 16

    def __post_init__(self) -> None:
        if (self.row_budget < 1 or self.row_cost < 0 or self.row_cost_lanes < 0
                or not 0.0 <= self.min_acceptance <= 1.0 or self.probe_every < 1):
            raise StatusError(
                Status.BAD_ARGUMENT,
                "LoadAwareDrafting: need row_budget >= 1, row_cost >= 0, row_cost_lanes >= 0, min_acceptance in [0, 1], "
                f"probe_every >= 1 (got {self.row_budget}, {self.row_cost}, {self.row_cost_lanes}, {self.min_acceptance}, "
                f"{self.probe_every})",
            )

    def row_cost_at(self, lanes: int) -> float:
        """One more row per lane, in passes, at ``lanes`` decoding lanes."""
        return self.row_cost * lanes / (lanes + self.row_cost_lanes)

    def draft_cap(self, lanes: int) -> int:
        """The most draft tokens per pass a lane may send at ``lanes`` decoding lanes (0: none)."""
        return max(0, self.row_budget // max(1, lanes) - 1)

    def probes(self, seq: Sequence) -> bool:
        """Whether ``seq`` drafts this tick to measure: it never has, or not for ``probe_every`` ticks."""
        return seq.drafted_ticks == 0 or seq.ticks_since_draft >= self.probe_every

    def drafting_pays(self, seqs: list[Sequence]) -> bool:
        """Whether the speculating lanes' measured gain covers what their draft rows cost the batch."""
        measured = [s for s in seqs if s.request.speculate and s.drafted_ticks]
        if len(seqs) == 1 or not measured:
            return True
        gain = sum(s.tokens_per_pass - 1.0 for s in measured) / len(seqs)
        return gain >= self.row_cost_at(len(seqs)) * max(s.draft_rows_per_pass for s in measured)

    def plan(self, seqs: list[Sequence], tick_tokens: int) -> dict[int, tuple[int, Optional[int]]]:
        k = self.draft_cap(len(seqs))
        pays = k > 0 and self.drafting_pays(seqs)
        threshold = max(self.min_acceptance, self.row_cost_at(len(seqs)))
        out: dict[int, tuple[int, Optional[int]]] = {}
        for seq in seqs:
            if not seq.request.speculate:
                out[seq.seq_id] = (tick_tokens, None)
            elif k and (self.probes(seq) or (pays and seq.acceptance >= threshold)):
                per_pass = min(seq.tokens_per_pass, 1 + k)
                out[seq.seq_id] = (max(tick_tokens, round(tick_tokens * per_pass)), k)
            else:
                out[seq.seq_id] = (tick_tokens, 0)
        return out

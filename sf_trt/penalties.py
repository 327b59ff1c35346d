"""A lane's logit adjustments, row by row: what the adjust graph is fed for each verify row.

:class:`LanePenalties` keeps one lane's books (every token its adjustments touch, with
whether it is in the prompt, its count in the output, its logit bias, whether
``min_tokens`` holds it back) and turns them, for one decode step, into the
adjust graph's entries for each of the step's rows (:mod:`sf_trt.graphs.adjust`).

Exactness. Row ``i`` of a step draws the token after the lane's tokens and the draft's
first ``i`` tokens, so its counts are the lane's plus those of ``draft[:i]``, and
``min_tokens`` reads ``emitted + i``: the row is fed exactly what a plain decode feeds
the row at that position, whether or not the draft is later taken. The rows of one step
share one list of entries (the lane's tokens, then the draft's new ones); an entry
whose token has not occurred before a row is ``(bias, 1, 0, 0)`` there, which leaves the
logit as the plain decode's row leaves it (``x / 1``, ``x - 0`` are exact).

Cost: a lane without adjustments has no books and its rows go through no adjust graph.
A lane with them pays ``O(entries * rows)`` numpy work per step, entries being the
distinct tokens it tracks (the prompt's only under ``repetition_penalty``).

A later per-row constraint (a grammar's token mask) plugs in here the same way: the
books would hold the grammar state after the lane's tokens, :meth:`rows` would advance
a copy of it through ``draft[:i]`` for row ``i`` (ending the draft at a token the
grammar forbids), and the mask would become one more input of the adjust graph.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .abi import SamplingFlag, SamplingParams
from .primitives import LogitAdjust

__all__ = ["LanePenalties", "StepAdjust", "pack"]

StepAdjust = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""One lane's step: ``ids [E]`` int64, then ``bias``, ``scale``, ``frequency``,
``presence`` float32 ``[rows, E]``."""


class LanePenalties:
    """One lane's adjustment books (module docstring). ``prompt``: the lane's prompt;
    ``eos``: the model's end token, which ``min_tokens`` holds back unless ``IGNORE_EOS``."""

    def __init__(self, params: SamplingParams, prompt: Sequence[int], eos: int) -> None:
        self.params = params
        self.counts_output = bool(params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0)
        self.emitted = 0
        self._index: dict[int, int] = {}
        self._ids: list[int] = []
        self._in_prompt: list[bool] = []
        self._count: list[int] = []
        self._bias: list[float] = []
        self._held: list[bool] = []
        if params.repetition_penalty != 1.0:
            for token in prompt:
                self._in_prompt[self._entry(int(token))] = True
        for token, bias in params.logit_bias:
            self._bias[self._entry(token)] = bias
        if params.min_tokens:
            held = set(params.stop_token_ids)
            if not params.flags & SamplingFlag.IGNORE_EOS:
                held.add(eos)
            for token in sorted(held):
                self._held[self._entry(token)] = True

    def _entry(self, token: int) -> int:
        at = self._index.get(token)
        if at is None:
            at = self._index[token] = len(self._ids)
            self._ids.append(token)
            self._in_prompt.append(False)
            self._count.append(0)
            self._bias.append(0.0)
            self._held.append(False)
        return at

    def extend(self, tokens: Sequence[int]) -> None:
        """The lane emitted ``tokens``."""
        self.emitted += len(tokens)
        if self.counts_output:
            for token in tokens:
                self._count[self._entry(int(token))] += 1

    def rows(self, draft: Sequence[int]) -> StepAdjust:
        """The entries of a step whose rows are the pending token then ``draft``: row
        ``i`` adjusts the draw after ``draft[:i]`` (``len(draft) + 1`` rows)."""
        n = len(draft) + 1
        ids = list(self._ids)
        where = []  # the entry of each draft token, new ones appended for this step only
        if self.counts_output and draft:
            extra: dict[int, int] = {}
            for token in draft:
                at = self._index.get(token)
                if at is None:
                    at = extra.get(token)
                    if at is None:
                        at = extra[token] = len(ids)
                        ids.append(token)
                where.append(at)
        e = len(ids)
        base = len(self._ids)
        count = np.zeros((n, e), np.int64)
        count[:, :base] = self._count
        for i, at in enumerate(where):  # row i + 1 and later see draft[i]
            count[i + 1 :, at] += 1
        p = self.params
        seen = count > 0
        seen[:, :base] |= np.asarray(self._in_prompt, bool)
        scale = np.where(seen, np.float32(p.repetition_penalty), np.float32(1.0)).astype(np.float32)
        frequency = (np.float32(p.frequency_penalty) * count.astype(np.float32)).astype(np.float32)
        presence = np.where(count > 0, np.float32(p.presence_penalty), np.float32(0.0)).astype(np.float32)
        bias = np.zeros((n, e), np.float32)
        bias[:, :base] = self._bias
        if p.min_tokens:
            early = (self.emitted + np.arange(n)) < p.min_tokens  # rows drawing output token emitted + i
            held = np.zeros(e, bool)
            held[:base] = self._held
            bias[early[:, None] & held[None, :]] = -np.inf
        return np.asarray(ids, np.int64), bias, scale, frequency, presence


def pack(steps: list[tuple[int, StepAdjust]]) -> LogitAdjust:
    """The :class:`sf_trt.primitives.LogitAdjust` of a pass from each adjusting lane's
    ``(first logit row, step)``: rows in order, each lane's entries padded to the widest
    with copies of its first entry (an identity entry ``id 0, (0, 1, 0, 0)`` for a lane
    with none), so duplicate ids write one value."""
    width = max(1, max(len(step[0]) for _, step in steps))
    rows, ids, values = [], [], [[], [], [], []]
    for first, (lane_ids, *lane_values) in steps:
        n = lane_values[0].shape[0]
        rows.append(np.arange(first, first + n, dtype=np.int64))
        if len(lane_ids) == 0:
            lane_ids = np.zeros(1, np.int64)
            lane_values = [np.full((n, 1), v, np.float32) for v in (0.0, 1.0, 0.0, 0.0)]
        pad = width - len(lane_ids)
        ids.append(np.repeat(np.concatenate([lane_ids, np.repeat(lane_ids[:1], pad)])[None, :], n, axis=0))
        for acc, v in zip(values, lane_values):
            acc.append(np.concatenate([v, np.repeat(v[:, :1], pad, axis=1)], axis=1))
    return LogitAdjust(np.concatenate(rows), np.concatenate(ids), *(np.concatenate(v) for v in values))

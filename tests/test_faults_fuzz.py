"""Fuzz: random schedules of lanes, random faults at random primitive calls.

Each example runs a random mix of lanes (greedy and sampled, speculating and
not, admitted at different ticks, prefilled in chunks, asking for random token
budgets) twice through the executor: on the fake with faults injected
(:class:`~sf_trt.faults.FaultyPrimitives`: raised before or after the call, or
logits poisoned) and on the fake without them, the control. It checks that

* after every tick the executor's invariants hold and every token a live lane
  holds was delivered (``run_lanes``);
* no token is lost: a lane that ends with ``Finish.ERROR`` delivered exactly the
  tokens the executor accepted from the backend before the fault (recorded
  between the executor and the faulty backend), and they are the control's;
* every other lane emits what it emits in the control run, token for token.

Bounded for CI: about a minute in all (``max_examples`` below, no deadline: a
tick's time depends on the machine's load, not on the example).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sf_trt.abi import Finish, Sampling, SamplingFlag, SamplingParams
from sf_trt.drafting import PromptLookupConfig
from sf_trt.executor import ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.faults import KINDS, OPS, Fault, FaultyPrimitives

from lanes import LaneSpec, run_lanes

VOCAB, EOS = 24, 23
MAX_LANES, MAX_FAULTS = 6, 3
TAG = 16
"""A lane's first prompt token is TAG + its id: it tells the recorder whose slot it is."""
CFG = FakeConfig(
    vocab=VOCAB, eos=EOS, copy_model=True, verify_rows=True,
    max_lanes=MAX_LANES + MAX_FAULTS,  # room for slots quarantined by failed releases
    max_context=96, max_rows_per_pass=64, top_k_limit=16,
)


class Recorder:
    """Between the executor and the backend: per slot, the tokens the executor
    accepted from each ``verify_sample`` it got an answer to (the matching draft
    prefix and the token at the first mismatch, a RowFault code not being a
    token), filed under the lane (its first prompt token) when the slot is
    released."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.owner: dict[int, int] = {}  # slot -> the token at its position 0
        self.accepted: dict[int, list[int]] = {}
        self.by_lane: dict[int, list[int]] = {}
        self._row_slots = np.zeros(0, np.int64)

    @property
    def capabilities(self):
        return self.inner.capabilities

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, rows):
        out = self.inner.forward(rows)
        for slot, pos, tok in zip(rows.slots.tolist(), rows.positions.tolist(), rows.tokens.tolist()):
            if pos == 0:
                self.owner[slot] = tok
        self._row_slots = rows.slots[rows.logit_rows]
        return out

    def verify_sample(self, logits, sample):
        tokens, match = self.inner.verify_sample(logits, sample)
        slots = self._row_slots.tolist()
        lo = 0
        while lo < len(slots):
            hi = lo
            while hi < len(slots) and slots[hi] == slots[lo]:
                hi += 1
            misses = np.flatnonzero(~match[lo:hi])
            taken = tokens[lo : lo + int(misses[0]) + 1] if misses.size else tokens[lo:hi]
            self.accepted.setdefault(slots[lo], []).extend(t for t in taken.tolist() if t >= 0)
            lo = hi
        return tokens, match

    def truncate(self, slot, length):
        self.inner.truncate(slot, length)

    def release(self, slot):
        if slot in self.owner:
            self.by_lane[self.owner.pop(slot) - TAG] = self.accepted.pop(slot, [])
        self.inner.release(slot)


@st.composite
def lane_specs(draw, lane: int):
    mode = draw(st.sampled_from([Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL]))
    params = SamplingParams(
        temperature=draw(st.sampled_from([0.5, 1.0, 1.7])),
        top_p=draw(st.sampled_from([1.0, 0.9])),
        top_k=draw(st.sampled_from([0, 3])),
        max_tokens=draw(st.sampled_from([0, 0, 7, 20])),
        flags=draw(st.sampled_from([SamplingFlag(0), SamplingFlag.IGNORE_EOS])),
    )
    return LaneSpec(
        prompt=(TAG + lane, *draw(st.lists(st.integers(0, 8), max_size=24))),
        mode=mode,
        params=params,
        speculate=draw(st.booleans()),
        seed=draw(st.integers(0, 2**40)),
        admit_tick=draw(st.integers(0, 3)),
        prefill_chunk=draw(st.integers(1, 12)),
        budgets=tuple(draw(st.lists(st.integers(1, 10), min_size=1, max_size=4))),
    )


@st.composite
def schedules(draw):
    n = draw(st.integers(1, MAX_LANES))
    return [draw(lane_specs(i)) for i in range(n)]


@st.composite
def faults(draw):
    out = []
    for _ in range(draw(st.integers(1, MAX_FAULTS))):
        op = draw(st.sampled_from(OPS))
        # not "huge": a finite logit is the backend's answer under greedy (it changes the
        # token, and no fault is due); tests/test_faults.py checks it under Gumbel
        kind = draw(st.sampled_from([k for k in KINDS if k != "huge"] if op == "decode" else ["raise", "raise_after"]))
        rows = None
        if kind not in ("raise", "raise_after") and draw(st.booleans()):
            rows = (draw(st.integers(0, 3)),)
        out.append(Fault(op, draw(st.integers(1, 12)), kind, rows))
    return out


draft_configs = st.builds(PromptLookupConfig, ngram_max=st.integers(1, 3), max_draft=st.integers(1, 6))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=schedules(), injected=faults(), draft=draft_configs, prefill_rows=st.sampled_from([None, 3, 8]),
    miss_every=st.sampled_from([0, 2, 3]),
)
def test_random_faults_lose_no_token_and_touch_no_other_lane(specs, injected, draft, prefill_rows, miss_every):
    config = ExecutorConfig(max_prefill_rows=prefill_rows)
    cfg = dataclasses.replace(CFG, copy_miss_every=miss_every)  # misses: drafts rejected, states truncated
    box = {}

    def faulty():
        box["rec"] = Recorder(FaultyPrimitives(FakePrimitives(cfg), injected))
        return box["rec"]

    got = run_lanes(faulty, specs, draft, executor_config=config)
    want = run_lanes(functools.partial(FakePrimitives, cfg), specs, draft, executor_config=config)
    rec = box["rec"]
    for fired in rec.inner.fired:
        event(f"fired: {fired.split(' #')[0]} {fired.split(': ')[1]}")
    event(f"lanes ended with ERROR: {sum(g.finish == Finish.ERROR for g in got)} of {len(got)}")
    for lane, (g, w) in enumerate(zip(got, want)):
        if g.finish == Finish.ERROR:
            assert g.error, f"lane {lane}: ERROR without a message"
            assert g.tokens == rec.by_lane.get(lane, []), f"lane {lane}: drew {rec.by_lane.get(lane)}, delivered {g.tokens}"
            assert g.tokens == w.tokens[: len(g.tokens)], f"lane {lane}: tokens before the fault differ from the control"
        else:
            assert (g.tokens, g.finish) == (w.tokens, w.finish), f"lane {lane} (no fault) differs from the control"
            assert g.error is None or g.error.startswith("release (lane"), g.error


"""Drafters: the protocol every kind follows, the kind registry, and prompt lookup
(the latest earlier match of the longest suffix, incrementally)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sf_trt.abi import CertMode, Exactness, Sampling, SamplingParams, Status, StatusError
from sf_trt.drafting import Drafter, PromptLookupConfig, PromptLookupDrafter, SuffixConfig, SuffixDrafter
from sf_trt.executor import Executor
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.strategies import KINDS, register_drafter_kind
from sf_trt.testing import Harness, register_drafter_with

from lanes import LaneSpec, plain_alone, run_lanes


def rescan(history: list[int], cfg: PromptLookupConfig, k: int) -> list[int]:
    """The definition, by brute force: a rescan of the whole history."""
    for n in range(cfg.ngram_max, cfg.ngram_min - 1, -1):
        if n > len(history):
            continue
        suffix = history[-n:]
        for end in range(len(history) - 2, n - 2, -1):
            if history[end - n + 1 : end + 1] == suffix:
                return history[end + 1 : end + 1 + k]
    return []


@settings(max_examples=200, deadline=None)
@given(
    history=st.lists(st.integers(0, 5), max_size=60),
    split=st.integers(0, 60),
    n_max=st.integers(1, 5),
    n_min=st.integers(1, 5),
    k=st.integers(0, 9),
)
def test_the_incremental_index_proposes_what_a_rescan_proposes(history, split, n_max, n_min, k):
    cfg = PromptLookupConfig(ngram_max=max(n_max, n_min), ngram_min=min(n_max, n_min), max_draft=8)
    d = PromptLookupDrafter(cfg, history[:split])
    d.extend(history[split:])
    assert d.propose(k) == rescan(history, cfg, k)


def test_the_longest_suffix_wins_and_the_latest_occurrence_of_it():
    cfg = PromptLookupConfig(ngram_max=3, ngram_min=1)
    # [1, 2] occurs at 0 and 5; the suffix [9, 1, 2] only at 3 (followed by 7).
    d = PromptLookupDrafter(cfg, [1, 2, 5, 9, 1, 2, 7, 1, 2, 6, 9, 1, 2])
    assert d.propose(2) == [7, 1]
    d = PromptLookupDrafter(cfg, [1, 2, 5, 1, 2, 6, 1, 2])
    assert d.propose(3) == [6, 1, 2], "the latest earlier [1, 2] is at 3..4"


def test_no_match_proposes_nothing():
    d = PromptLookupDrafter(PromptLookupConfig(), [1, 2, 3, 4])
    assert d.propose(5) == []
    assert PromptLookupDrafter(PromptLookupConfig()).propose(5) == []


@pytest.mark.parametrize("kwargs", [dict(ngram_min=0), dict(ngram_min=3, ngram_max=2), dict(max_draft=0)])
def test_bad_configs_are_refused(kwargs):
    with pytest.raises(StatusError) as err:
        PromptLookupConfig(**kwargs)
    assert err.value.status == Status.REGISTRATION_REFUSED
    assert "PromptLookupConfig" in str(err.value)


# -- the protocol and the kind registry ------------------------------------------------------------


def test_every_drafter_follows_the_protocol():
    for d in (PromptLookupDrafter(PromptLookupConfig(), [1, 2, 1]), SuffixDrafter(SuffixConfig(), [1, 2, 1])):
        assert isinstance(d, Drafter)
        assert d.history_len == 3 and d.draft_cap >= 1
        d.extend([2])
        assert d.history_len == 4
        d.observe(len(d.propose(4)), 0)
        d.retire()


class Stubborn:
    """A drafter kind that proposes nonsense: the last token, over and over."""

    def __init__(self, tokens):
        self.tokens = list(tokens)
        self.draft_cap = 5
        self.retired = False

    @property
    def history_len(self):
        return len(self.tokens)

    def extend(self, tokens):
        self.tokens.extend(tokens)

    def propose(self, max_len):
        return [self.tokens[-1]] * max_len

    def observe(self, proposed, accepted):
        pass

    def retire(self):
        self.retired = True


def test_a_registered_kind_is_built_by_the_executor_and_certified_exact_like_every_other(monkeypatch):
    made = []
    monkeypatch.setattr("sf_trt.strategies.KINDS", dict(KINDS))
    register_drafter_kind("stubborn", PromptLookupConfig, lambda cfg, shared, tokens, scope: made.append(Stubborn(tokens)) or made[-1])
    make = functools.partial(FakePrimitives, FakeConfig(vocab=24, eos=23, copy_model=True, copy_miss_every=3, verify_rows=True))
    h = Harness.with_engine(Executor(make()))
    _, certs = register_drafter_with(h, "stubborn", bytes(32), bytes(32), 0)
    assert [(c.exactness, c.sampling_modes) for c in certs] == [(Exactness.DISTRIBUTION_EXACT, CertMode.GREEDY | CertMode.GUMBEL)]
    for mode, params in ((Sampling.GPU_GREEDY, SamplingParams(max_tokens=30)), (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=30))):
        spec = LaneSpec(prompt=(1, 2, 3, 3, 3), mode=mode, params=params, speculate="stubborn", seed=9, budgets=(7, 7, 20))
        (run,) = run_lanes(make, [spec], harness=h)
        alone = plain_alone(make, spec)
        assert (run.tokens, run.finish) == (alone.tokens, alone.finish)
        assert run.proposed > 0 and made[-1].retired

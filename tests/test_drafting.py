"""Prompt-lookup drafting: the latest earlier match of the longest suffix, incrementally."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sf_trt.abi import Status, StatusError
from sf_trt.drafting import PromptLookupConfig, PromptLookupDrafter


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

"""The executor against itself: speculative == plain, lanes independent, budgets exact.

Every property compares a speculating run with a plain one, token for token and
finish code for finish code, over random prompts, parameters, budgets, miss
patterns, mixes of lanes and every drafter kind (prompt lookup; suffix, with
corpora shared across plans and scopes). The harness checks the executor's
invariants, the corpus bounds among them, after every tick.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import DIGEST, ID, LaneSpec, plain_alone, run_lanes

from sf_trt.abi import Finish, Sampling, SamplingFlag, SamplingParams
from sf_trt.drafting import PromptLookupConfig, SuffixConfig
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.testing import Harness, register_prompt_lookup_with

VOCAB = 24
EOS = 23

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fake(miss_every: int = 0, max_context: int = 256, max_lanes: int = 8):
    cfg = FakeConfig(
        vocab=VOCAB, eos=EOS, copy_model=True, copy_miss_every=miss_every, verify_rows=True,
        max_lanes=max_lanes, max_context=max_context, max_rows_per_pass=128, top_k_limit=16,
    )
    return functools.partial(FakePrimitives, cfg)


# A small vocabulary and short alphabets make the text repeat, so drafts are found.
prompts = st.lists(st.integers(0, 8), min_size=1, max_size=40).map(tuple)
eos_prompts = st.lists(st.sampled_from([1, 2, 3, EOS]), min_size=2, max_size=30).map(tuple)


@st.composite
def params(draw):
    mode = draw(st.sampled_from([Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL]))
    p = SamplingParams(
        temperature=draw(st.sampled_from([0.5, 0.8, 1.0, 1.7])),
        top_p=draw(st.sampled_from([1.0, 0.95, 0.7, 0.3])),
        top_k=draw(st.sampled_from([0, 0, 1, 3, 16])),
        max_tokens=draw(st.sampled_from([0, 0, 1, 5, 30])),
        flags=draw(st.sampled_from([SamplingFlag(0), SamplingFlag.IGNORE_EOS])),
        min_p=draw(st.sampled_from([0.0, 0.0, 0.05, 0.3])),
    )
    return mode, p


@st.composite
def lane_specs(draw, prompt_strategy=prompts):
    mode, p = draw(params())
    return LaneSpec(
        prompt=draw(prompt_strategy),
        mode=mode,
        params=p,
        speculate=True,
        seed=draw(st.integers(0, 2**63 - 1)),
        admit_tick=draw(st.integers(0, 3)),
        prefill_chunk=draw(st.integers(1, 16)),
        budgets=tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=5))),
    )


prompt_lookup_configs = st.builds(
    PromptLookupConfig,
    ngram_max=st.integers(1, 4),
    ngram_min=st.just(1),
    max_draft=st.integers(1, 10),
    adaptive=st.booleans(),
)
suffix_configs = st.builds(
    SuffixConfig,
    max_draft=st.integers(1, 10),
    max_match=st.integers(1, 8),
    match_factor=st.sampled_from([0.5, 1.0, 2.0, 8.0]),
    min_prob=st.sampled_from([0.0, 0.1, 0.5]),
    adaptive=st.booleans(),
    corpus_tokens=st.sampled_from([0, 16, 64, 4096]),
    corpus_requests=st.sampled_from([1, 3, 100]),
    corpus_generations=st.integers(1, 4),
    corpus_scopes=st.integers(1, 3),
)
draft_configs = st.one_of(prompt_lookup_configs, suffix_configs)


@SETTINGS
@given(spec=lane_specs(), miss_every=st.sampled_from([0, 0, 2, 3, 5]), cfg=draft_configs)
def test_one_speculating_lane_emits_what_the_plain_lane_emits(spec, miss_every, cfg):
    make = fake(miss_every)
    (spec_run,) = run_lanes(make, [spec], cfg)
    plain = plain_alone(make, spec)
    assert (spec_run.tokens, spec_run.finish) == (plain.tokens, plain.finish)
    assert plain.proposed == plain.accepted == 0
    assert 0 <= spec_run.accepted <= spec_run.proposed


@SETTINGS
@given(spec=lane_specs(eos_prompts), cfg=draft_configs)
def test_eos_inside_drafts_ends_the_lane_exactly_where_plain_does(spec, cfg):
    spec = dataclasses.replace(spec, params=dataclasses.replace(spec.params, flags=SamplingFlag(0)))
    (spec_run,) = run_lanes(fake(), [spec], cfg)
    plain = plain_alone(fake(), spec)
    assert (spec_run.tokens, spec_run.finish) == (plain.tokens, plain.finish)
    if plain.finish == Finish.EOS:
        assert plain.tokens[-1] == EOS and EOS not in plain.tokens[:-1]


@SETTINGS
@given(specs=st.lists(lane_specs(), min_size=2, max_size=6),
       spec_mask=st.lists(st.sampled_from([False, "prompt_lookup", "suffix"]), min_size=6, max_size=6),
       miss_every=st.sampled_from([0, 3]))
def test_many_lanes_sharing_ticks_each_emit_what_they_emit_alone(specs, spec_mask, miss_every):
    make = fake(miss_every)
    specs = [dataclasses.replace(s, speculate=m) for s, m in zip(specs, spec_mask)]
    together = run_lanes(make, specs)
    for s, run in zip(specs, together):
        alone = plain_alone(make, s)
        assert (run.tokens, run.finish) == (alone.tokens, alone.finish)
        if not s.speculate:
            assert run.proposed == run.accepted == 0


scopes = st.sampled_from(["", "", "tenant-a", "tenant-b", None])


@SETTINGS
@given(batches=st.lists(st.lists(lane_specs(), min_size=1, max_size=5), min_size=2, max_size=4),
       lane_scopes=st.lists(scopes, min_size=20, max_size=20), cfg=suffix_configs, miss_every=st.sampled_from([0, 0, 3]))
def test_lanes_drafting_from_shared_corpora_across_plans_emit_what_they_emit_alone(batches, lane_scopes, cfg, miss_every):
    """One executor runs plan after plan; finished lanes feed their scope's corpus,
    later lanes draft from it; each lane still emits what it emits alone, plain."""
    make = fake(miss_every)
    h = Harness.with_engine(Executor(make(), ExecutorConfig()))
    scope_of = iter(lane_scopes)
    for batch in batches:
        batch = [dataclasses.replace(s, speculate=True, scope=next(scope_of)) for s in batch]
        for s, run in zip(batch, run_lanes(make, batch, cfg, harness=h)):
            alone = plain_alone(make, s)
            assert (run.tokens, run.finish) == (alone.tokens, alone.finish)
            assert 0 <= run.accepted <= run.proposed


@SETTINGS
@given(batches=st.lists(st.lists(lane_specs(eos_prompts), min_size=1, max_size=4), min_size=2, max_size=3), cfg=suffix_configs)
def test_eos_inside_drafts_from_the_corpus_ends_lanes_where_plain_does(batches, cfg):
    """Earlier outputs end in EOS, so corpus drafts carry EOS mid-draft."""
    h = Harness.with_engine(Executor(fake()(), ExecutorConfig()))
    for batch in batches:
        batch = [dataclasses.replace(s, speculate=True, params=dataclasses.replace(s.params, flags=SamplingFlag(0))) for s in batch]
        for s, run in zip(batch, run_lanes(fake(), batch, cfg, harness=h)):
            alone = plain_alone(fake(), s)
            assert (run.tokens, run.finish) == (alone.tokens, alone.finish)


@SETTINGS
@given(spec=lane_specs())
def test_decode_n_emits_exactly_n_unless_the_lane_finishes(spec):
    h = Harness.with_engine(Executor(fake()(), ExecutorConfig()))
    slot, _ = register_prompt_lookup_with(h, ID, DIGEST, 0)
    p = h.prompt(list(spec.prompt))
    plan = h.plan().admit(1, p, strategy_slot=slot, sampling=spec.mode, params=spec.params, rng_counter_base=spec.seed)
    plan.prefill(1, 0, len(spec.prompt))
    emitted = 0
    for i, n in enumerate(spec.budgets):
        e = h.tick_ok((plan if i == 0 else h.plan()).decode(1, n)).emit_for(1)
        got = h.rings_tokens(e.token_ref)
        emitted += len(got)
        if e.finish == Finish.NONE:
            assert len(got) == n
        else:
            assert len(got) <= n
            if e.finish == Finish.LENGTH:
                assert emitted == spec.params.max_tokens
            break


def test_the_context_ends_a_lane_with_finish_context():
    prompt = [1, 2, 3, 1, 2]
    specs = [LaneSpec(prompt=tuple(prompt), speculate=s, budgets=(50,)) for s in (False, True)]
    runs = [run_lanes(fake(max_context=20), [s])[0] for s in specs]
    for run in runs:
        assert run.finish == Finish.CONTEXT
        assert len(prompt) + len(run.tokens) == 20
    assert runs[0].tokens == runs[1].tokens


def test_a_released_lane_can_be_admitted_again_and_starts_fresh():
    h = Harness.with_engine(Executor(fake()(), ExecutorConfig()))
    p = h.prompt([1, 2, 3, 1, 2])
    first = h.tick_ok(h.plan().admit(4, p).prefill(4, 0, 5).decode(4, 6).release(4)).emit_for(4)
    assert first.finish == Finish.ABORTED
    again = h.tick_ok(h.plan().admit(4, p).prefill(4, 0, 5).decode(4, 6)).emit_for(4)
    assert h.rings_tokens(again.token_ref) == h.rings_tokens(first.token_ref)


def test_finished_lanes_are_released_at_the_end_of_their_tick():
    h = Harness.with_engine(Executor(fake()(), ExecutorConfig()))
    p = h.prompt([1, 2, 3])
    e = h.tick_ok(h.plan().admit(1, p, params=SamplingParams(max_tokens=3)).prefill(1, 0, 3).decode(1, 10)).emit_for(1)
    assert (e.finish, len(h.rings_tokens(e.token_ref))) == (Finish.LENGTH, 3)
    assert h.engine.lanes == []
    h.tick_ok(h.plan().admit(1, p).prefill(1, 0, 3))  # the id is free again


def test_tokens_stay_readable_across_ring_wraparound():
    cfg = FakeConfig(vocab=VOCAB, eos=EOS, copy_model=True, verify_rows=True, max_context=512)
    h = Harness.with_engine(Executor(FakePrimitives(cfg), ExecutorConfig(ring_capacity=10)))
    p = h.prompt([1, 2, 3])
    h.tick_ok(h.plan().admit(1, p, params=SamplingParams(flags=SamplingFlag.IGNORE_EOS)).prefill(1, 0, 3))
    seen, refs = [], []
    for n in (7, 7, 7):
        e = h.tick_ok(h.plan().decode(1, n)).emit_for(1)
        refs.append(e.token_ref)
        seen.extend(h.rings_tokens(e.token_ref))
    assert seen == h.engine.lane_tokens(1)[3:]
    with pytest.raises(Exception, match="overwritten"):
        h.rings_tokens(refs[0])


def test_the_copy_model_leaves_the_favoured_token_at_a_visible_rate_when_sampled():
    """SPEC 8: at temperature 0.8, top_p 0.95 a plain decode is not greedy in disguise."""
    prompt = [20, 21, 22, 23, 20, 21, 22, 23, 20, 21]
    cfg = FakeConfig(vocab=512, eos=511, copy_model=True, verify_rows=True)
    params = SamplingParams(temperature=0.8, top_p=0.95, flags=SamplingFlag.IGNORE_EOS)
    sampled = run_lanes(functools.partial(FakePrimitives, cfg), [LaneSpec(tuple(prompt), Sampling.GPU_GUMBEL, params, seed=5, budgets=(400,))])[0]
    greedy = run_lanes(functools.partial(FakePrimitives, cfg), [LaneSpec(tuple(prompt), budgets=(400,))])[0]
    # The favoured token at each position is what greedy would pick given the same history.
    history = list(prompt)
    left = 0
    for tok in sampled.tokens:
        fav = _favoured(history, 512, 511)
        left += tok != fav
        history.append(tok)
    assert left / len(sampled.tokens) >= 0.05, f"left the favoured token at {left} of {len(sampled.tokens)} positions"
    assert left / len(sampled.tokens) <= 0.5, "the favoured token gets most of the probability"
    assert greedy.tokens[:4] == [22, 23, 20, 21]


def _favoured(history, vocab, eos):
    t = len(history) - 1
    for j in range(t - 1, -1, -1):
        if history[j] == history[t]:
            return history[j + 1]
    f = (history[t] * 7 + 3) % vocab
    return (f + 1) % vocab if f == eos else f


def test_speculation_takes_fewer_passes_when_the_text_repeats():
    prompt = tuple([5, 6, 7, 8, 9, 10, 11] * 4)
    plain, spec = (run_lanes(fake(), [LaneSpec(prompt, speculate=s, budgets=(40,))])[0] for s in (False, True))
    assert spec.tokens == plain.tokens
    assert spec.accepted >= 30, f"{spec.accepted} of {spec.proposed} drafts taken on text that repeats"


def test_adaptive_drafting_shrinks_drafts_after_rejections():
    from sf_trt.drafting import PromptLookupDrafter

    d = PromptLookupDrafter(PromptLookupConfig(max_draft=8), [1, 2, 1, 2])
    d.observe(8, 0)
    assert d.draft_cap == 1
    assert d.propose(4) == [], "one step without drafting after a miss"
    assert d.propose(4) == [1, 2]
    d.observe(1, 0)
    assert [d.propose(4) for _ in range(3)] == [[], [], [1, 2]], "the back-off doubles"
    d.observe(1, 1)
    d.observe(2, 2)
    assert d.draft_cap == 4
    fixed = PromptLookupDrafter(PromptLookupConfig(max_draft=8, adaptive=False))
    fixed.observe(8, 0)
    assert fixed.draft_cap == 8


@SETTINGS
@given(a_first=st.lists(lane_specs(), min_size=1, max_size=3), a_then=st.lists(lane_specs(), min_size=1, max_size=3),
       cfg=suffix_configs)
def test_what_ran_in_scope_b_changes_nothing_a_lane_in_scope_a_does(a_first, a_then, cfg):
    """Scope b runs the very requests scope a runs next: if a could draft from b's
    text it would take other drafts and other passes. It emits exactly the same."""
    cfg = dataclasses.replace(cfg, corpus_scopes=2)
    in_scope = lambda specs, scope: [dataclasses.replace(s, speculate=True, scope=scope) for s in specs]  # noqa: E731
    runs = []
    for b_runs_first in (False, True):
        h = Harness.with_engine(Executor(fake()(), ExecutorConfig()))
        run_lanes(fake(), in_scope(a_first, "a"), cfg, harness=h)
        if b_runs_first:
            run_lanes(fake(), in_scope(a_then, "b"), cfg, harness=h)
        runs.append(run_lanes(fake(), in_scope(a_then, "a"), cfg, harness=h))
    assert runs[0] == runs[1], "tokens, finish, drafts proposed and accepted, passes: all the same"


def test_a_repeated_request_drafts_from_its_scopes_corpus():
    cfg = FakeConfig(vocab=512, eos=511, copy_model=True, verify_rows=True, max_lanes=4, max_context=256)
    make = functools.partial(FakePrimitives, cfg)
    spec = LaneSpec(prompt=tuple(range(40, 70)), params=SamplingParams(flags=SamplingFlag.IGNORE_EOS), budgets=(80,), speculate=True)
    h = Harness.with_engine(Executor(make(), ExecutorConfig()))
    suffix = SuffixConfig()
    (first,) = run_lanes(make, [spec], suffix, harness=h)
    (again,) = run_lanes(make, [spec], suffix, harness=h)
    (elsewhere,) = run_lanes(make, [dataclasses.replace(spec, scope="other")], suffix, harness=h)
    (lookup,) = run_lanes(make, [spec], PromptLookupConfig())
    assert first.tokens == again.tokens == elsewhere.tokens == lookup.tokens
    assert again.accepted >= 70 and again.passes <= 8, f"the whole output was drafted from the corpus ({again})"
    assert (elsewhere.accepted, elsewhere.passes) == (first.accepted, first.passes), "another scope drafts as the first request did"
    assert again.passes < lookup.passes

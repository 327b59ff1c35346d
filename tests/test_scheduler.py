"""The scheduler (sf_trt/scheduler/): stops cut exactly where they complete, the same
with speculation on and off; the drafting policy; seeds per choice; faults."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sf_trt.abi import Finish, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.generate import Generator
from sf_trt.scheduler import DraftPolicy, LoadAwareDrafting, Request, Sequence, choice_key
from sf_trt.tokenizer import ByteTokenizer

from fakes import POISON, FaultyFake

# Bytes as tokens; a small alphabet in the prompts makes the copy model repeat (drafts accepted).
CFG = FakeConfig(vocab=257, eos=256, copy_model=True, copy_miss_every=5, verify_rows=True, max_lanes=4, max_context=256, top_k_limit=16)
TOK = ByteTokenizer(257, 256)
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])

texts = st.text(alphabet="abc d\n", min_size=4, max_size=40)


def gen(**kw) -> Generator:
    """A Generator whose lanes draft whenever the drafter finds a draft (the default
    policy sheds drafts in full batches, which would leave these tests fewer to check)."""
    return Generator(FakePrimitives(CFG), tokenizer=TOK, **{"policy": DraftPolicy(), **kw})


def request(text: str, *, sampled: bool, **kw) -> Request:
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=60) if sampled else SamplingParams(max_tokens=60)
    return Request(TOK.encode(text), Sampling.GPU_GUMBEL if sampled else Sampling.GPU_GREEDY, params, seed=5, **kw)


def streamed_prefix_reaching(tokens: list[int], n_chars: int) -> int:
    """How many tokens it takes for their text, decoded as it streams (an unfinished
    UTF-8 character held back), to reach ``n_chars`` characters."""
    stream, text = TOK.stream(skip_special=True), ""
    for j, tok in enumerate(tokens):
        text += stream.push(tok)
        if len(text) >= n_chars:
            return j + 1
    if len(text + stream.flush()) >= n_chars:  # an unfinished character at the end, as U+FFFD
        return len(tokens)
    raise AssertionError("the text never got that long")


@SETTINGS
@given(text=texts, sampled=st.booleans(), start=st.integers(0, 50), length=st.integers(1, 4), tick=st.integers(1, 9))
def test_a_stop_string_ends_the_output_at_the_token_that_completes_it_with_speculation_on_and_off(text, sampled, start, length, tick):
    (plain,) = gen().run([request(text, sampled=sampled, speculate=False)])
    out = plain.text
    stop = out[start : start + length] if start < len(out) else "\x07never"
    at = out.find(stop)
    for speculate in (False, True):
        g = gen(tick_tokens=tick)
        streamed = {"tokens": [], "text": []}
        (res,) = g.run([request(text, sampled=sampled, speculate=speculate, stop=(stop,))],
                       lambda i, new: streamed["tokens"].extend(new))
        if at < 0:
            assert (res.tokens, res.text, res.finish) == (plain.tokens, plain.text, plain.finish)
            continue
        # the output ends at the token completing the first match; the text at the match's start
        ends = streamed_prefix_reaching(plain.tokens, at + len(stop))
        assert res.tokens == plain.tokens[:ends]
        assert res.text == out[:at]
        assert (res.finish, res.stop_reason) == (Finish.STOP, stop)
        assert streamed["tokens"] == res.tokens  # nothing past the stop was ever reported
        assert g.executor.lanes == []  # the lane was released


def test_whichever_of_stop_eos_and_max_tokens_comes_first_wins():
    text = "ab ab ab ab ab"
    (plain,) = gen().run([request(text, sampled=False, speculate=False)])
    stop = plain.text[10:12]
    at = plain.text.find(stop)
    n_stop = len(gen().run([request(text, sampled=False, stop=(stop,))])[0].tokens)
    for max_tokens, want in ((n_stop - 1, Finish.LENGTH), (n_stop, Finish.STOP), (n_stop + 3, Finish.STOP)):
        for speculate in (False, True):
            r = request(text, sampled=False, speculate=speculate, stop=(stop,))
            (res,) = gen().run([dataclasses.replace(r, params=SamplingParams(max_tokens=max_tokens))])
            assert res.finish == want and len(res.tokens) == min(n_stop, max_tokens)
            assert res.text == (plain.text[:at] if want == Finish.STOP else TOK.decode(res.tokens, skip_special=True))
    # EOS first: a stop string that never appears leaves the EOS finish alone
    eos_prompt = [ord("x"), 256, ord("x")]  # the copy model favours what followed "x": EOS
    (res,) = gen().run([Request(eos_prompt, stop=("zzz",), params=SamplingParams(max_tokens=20))])
    assert res.finish == Finish.EOS and res.tokens[-1] == 256 and res.text == TOK.decode(res.tokens, skip_special=True)


def test_stop_token_ids_keep_the_token_but_not_its_text():
    text = "abcabcabc"
    (plain,) = gen().run([request(text, sampled=False, speculate=False)])
    stop_id = plain.tokens[4]
    j = plain.tokens.index(stop_id)
    for speculate in (False, True):
        (res,) = gen().run([request(text, sampled=False, speculate=speculate, stop_token_ids=(stop_id,))])
        assert res.tokens == plain.tokens[: j + 1]
        assert res.text == TOK.decode(plain.tokens[:j], skip_special=True)
        assert (res.finish, res.stop_reason) == (Finish.STOP, stop_id)


def test_streamed_text_never_runs_past_a_stop_and_adds_up_to_the_final_text():
    g = gen(tick_tokens=7)
    r = request("one two one two one two", sampled=True, speculate=True, stop=("e tw", "xyz"), logprobs=2)
    seq = g.scheduler.add(r, seq_id=3)
    parts, tokens, lps = [], [], 0
    while g.scheduler.has_work:
        for u in g.scheduler.step():
            parts.append(u.text)
            tokens += u.tokens
            lps += len(u.logprobs) if u.logprobs is not None else 0
            assert "e tw" not in "".join(parts)
    assert "".join(parts) == seq.text and tokens == seq.tokens and lps == len(tokens)
    assert len(seq.logprobs) == len(seq.tokens)


def test_requests_check_stop_settings_and_drafters():
    g = Generator(FakePrimitives(CFG))  # no tokenizer
    with pytest.raises(StatusError, match="stop strings need a tokenizer") as err:
        g.run([Request([1, 2], stop=("a",))])
    assert err.value.status == Status.UNSUPPORTED
    with pytest.raises(StatusError, match=r"stop token ids \[300\] outside 0..256"):
        g.run([Request([1, 2], stop_token_ids=(300,))])
    with pytest.raises(StatusError, match=r"unknown drafter 'suffix-tree' \(known: \['prompt-lookup'"):
        g.run([Request([1, 2], drafter="suffix-tree")])
    with pytest.raises(StatusError, match="max_draft must be an int in 0..256"):
        g.run([Request([1, 2], max_draft=999)])
    assert g.executor.lanes == [] and g.executor.snapshot()[3] == ()


def test_max_draft_per_request_registers_its_own_slot_and_changes_no_token():
    text = "the cat sat on the mat; the cat sat on the mat; the cat"
    outs = [gen().run([request(text, sampled=True, max_draft=m)])[0] for m in (1, 3, 0)]
    assert outs[0].tokens == outs[1].tokens == outs[2].tokens
    assert 0 < outs[0].proposed <= outs[0].passes  # at most one draft token per pass
    assert outs[1].proposed > outs[0].proposed


# -- the drafting policy ---------------------------------------------------------------------------


def seqs(n: int, acceptance: float = 0.9, speculate: bool = True) -> list[Sequence]:
    out = []
    for i in range(n):
        s = Sequence(i, Request([1], speculate=speculate), 1, None, 0.0)
        s.recent_accepted, s.recent_proposed = acceptance * 10, 10.0
        out.append(s)
    return out


def seqs_with(n: int, per_pass: float, acceptance: float = 0.9, drafted: int = 3, draft_rows: float = 3.0, idle: int = 0) -> list[Sequence]:
    out = seqs(n, acceptance)
    for s in out:
        s.tokens_per_pass, s.drafted_ticks, s.draft_rows_per_pass, s.ticks_since_draft = per_pass, drafted, draft_rows, idle
    return out


def test_load_aware_drafting_caps_drafts_by_the_batch():
    p = LoadAwareDrafting(row_budget=16, row_cost=0.0, probe_every=1000)
    for n, k in ((1, 15), (2, 7), (4, 3), (8, 1), (9, 0), (16, 0)):
        assert {md for _, md in p.plan(seqs_with(n, 3.0), 8).values()} == {k}, n
    assert p.plan(seqs(3, speculate=False), 8) == {0: (8, None), 1: (8, None), 2: (8, None)}  # no drafter: left alone


def test_load_aware_drafting_drafts_only_while_the_gain_pays_for_the_padding():
    p = LoadAwareDrafting(row_budget=16, row_cost=0.6, row_cost_lanes=4.0, probe_every=16)
    assert p.row_cost_at(1) == pytest.approx(0.12) and p.row_cost_at(4) == pytest.approx(0.3) and p.row_cost_at(8) == pytest.approx(0.4)

    def cap(batch):
        return {md for _, md in p.plan(batch, 8).values()}

    # one lane: its own acceptance decides; a draft token costs 0.12 of a pass, so 15% taken pays, 10% does not
    assert cap(seqs_with(1, 1.0, acceptance=0.15)) == {15} and cap(seqs_with(1, 3.0, acceptance=0.1)) == {0}
    # four lanes: 3 rows cost 0.9; only lanes that double their tokens per pass make it pay
    assert cap(seqs_with(4, 1.5)) == {0} and cap(seqs_with(4, 2.0)) == {3}
    # lanes that do not speculate dilute the gain but pay the padding
    mixed = seqs_with(4, 2.0)
    mixed[2].request = mixed[3].request = Request([1], speculate=False)
    assert cap(mixed) == {0, None}
    # a lane that never drafted, or not for probe_every of its ticks, drafts anyway (a probe)
    assert cap(seqs_with(4, 1.0, drafted=0)) == {3} and cap(seqs_with(4, 1.0, idle=16)) == {3}
    assert cap(seqs_with(4, 1.0, idle=15)) == {0}
    probe = seqs_with(2, 1.0)
    probe[1].seq_id, probe[1].drafted_ticks = 1, 0
    assert p.plan(probe, 8) == {0: (8, 0), 1: (8, 7)}  # only the new lane probes
    # drafts that proposed nothing cost nothing: such a lane keeps drafting
    assert cap(seqs_with(1, 1.0, draft_rows=0.0)) == {15}
    # in a drafting tick, a lane whose drafts are rarely taken sends none (but on a probe)
    low = seqs_with(1, 3.0) + seqs_with(1, 3.0, acceptance=0.1)
    low[1].seq_id = 1
    assert p.plan(low, 8) == {0: (24, 7), 1: (8, 0)}
    low[1].ticks_since_draft = 16
    assert p.plan(low, 8) == {0: (24, 7), 1: (24, 7)}
    with pytest.raises(StatusError, match="LoadAwareDrafting: need row_budget >= 1"):
        LoadAwareDrafting(row_budget=0)


def test_a_lanes_draft_record_starts_from_the_prior_and_fades_and_its_idle_ticks_count():
    from sf_trt.engine import Emit, SpecCounts, TokenRef
    from sf_trt.scheduler.sequence import ACCEPTANCE_DECAY, ACCEPTANCE_PRIOR

    REF = TokenRef(0, 0, 8)  # apply() reads only the counts and the tokens it is given
    seq = Sequence(0, Request([1]), 1, None, 0.0)
    assert seq.acceptance == ACCEPTANCE_PRIOR[0] / ACCEPTANCE_PRIOR[1] == 0.5
    seq.may_draft = True
    seq.apply(Emit(0, REF, Finish.NONE, SpecCounts(proposed=8, accepted=0, drafts=1), passes=8), [1] * 8, 0.0)
    a, p = ACCEPTANCE_PRIOR
    assert seq.acceptance == pytest.approx(ACCEPTANCE_DECAY * a / (ACCEPTANCE_DECAY * p + 8))  # one bad draft: not yet off
    assert (seq.drafted_ticks, seq.ticks_since_draft) == (1, 0)
    seq.may_draft = False
    for ticks in (1, 2):
        seq.apply(Emit(0, REF, Finish.NONE, SpecCounts(), passes=8), [1] * 8, 0.0)
        assert seq.ticks_since_draft == ticks
    assert LoadAwareDrafting(probe_every=2).probes(seq) and not LoadAwareDrafting(probe_every=3).probes(seq)


def test_load_aware_drafting_asks_lanes_whose_drafts_are_taken_for_more_tokens_per_tick():
    p = LoadAwareDrafting(row_budget=24, row_cost=0.0, probe_every=1000)
    batch = seqs_with(3, 1.0)
    batch[0].tokens_per_pass = 1.2
    batch[1].tokens_per_pass, batch[2].tokens_per_pass = 2.5, 40.0
    assert p.plan(batch, 8) == {0: (10, 7), 1: (20, 7), 2: (64, 7)}  # at most 1 + k tokens per pass


def test_load_aware_drafting_changes_no_token_and_sheds_drafts_in_a_full_batch():
    reqs = [request(t, sampled=i % 2 == 1) for i, t in enumerate(["ab ab ab ab", "xyz xyz xy", "the the the", "a b c a b c"])]
    alone = [gen().run([dataclasses.replace(r, speculate=False)])[0] for r in reqs]
    free = gen().run(reqs)
    shed = gen(policy=LoadAwareDrafting(row_budget=4)).run(reqs)  # 4 lanes: no drafting at all
    for a, f, s in zip(alone, free, shed):
        assert a.tokens == f.tokens == s.tokens
        assert s.proposed == 0
    assert sum(f.proposed for f in free) > 0


# -- seeds ---------------------------------------------------------------------------------------


def test_choice_keys_use_the_seed_for_choice_0_and_splitmix64_for_the_others():
    from sf_trt.scheduler.requests import _splitmix64

    assert _splitmix64(0) == 0xE220A8397B1DCDAF  # SplitMix64's first output from state 0 (published)
    assert choice_key(42, 0) == 42
    assert choice_key(42, 1) == _splitmix64(_splitmix64(42) ^ 1) >> 1
    keys = {choice_key(s, i) for s in range(200) for i in range(8)}
    assert len(keys) == 1600 and all(0 <= k < 2**63 for k in keys)
    assert choice_key(42, 1) != choice_key(43, 0) and choice_key(2**63 - 1, 5) < 2**63
    with pytest.raises(StatusError, match="seed must be in 0..2\\*\\*63-1"):
        choice_key(-1, 0)


def test_choices_of_one_seed_are_independent_streams():
    text = "abcd abcd abcd"
    g = gen()
    r = request(text, sampled=True, speculate=False)
    res = g.run([dataclasses.replace(r, seed=choice_key(7, i)) for i in range(4)])
    assert len({tuple(x.tokens) for x in res}) == 4
    again = gen().run([dataclasses.replace(r, seed=choice_key(7, 2))])[0]
    assert again.tokens == res[2].tokens


# -- faults ----------------------------------------------------------------------------------------

def test_a_tick_that_raises_fails_its_requests_with_an_error_and_the_scheduler_goes_on():
    g = Generator(FaultyFake(CFG), tokenizer=TOK)
    res = g.run([Request([1, 2, POISON, 3], params=SamplingParams(max_tokens=8))])
    assert res[0].finish == Finish.ERROR and "injected fault: poisoned row" in res[0].error
    assert not g.scheduler.has_work and g.executor.lanes == []  # nothing held afterwards
    ok = g.run([Request([1, 2, 3], params=SamplingParams(max_tokens=8))])
    assert ok[0].finish == Finish.LENGTH and len(ok[0].tokens) == 8


def test_a_failed_pass_ends_only_its_own_lanes_and_the_requests_behind_them_run_as_alone():
    """The executor ends the lanes of a pass that raised (docs/errors.md); with one lane
    slot the good request waits behind the bad one, never shares its pass, and runs
    exactly as it would alone."""
    g = Generator(FaultyFake(dataclasses.replace(CFG, max_lanes=1)), tokenizer=TOK, prefill_chunk=2)
    good = Request([1, 2, 3, 1, 2], params=SamplingParams(max_tokens=12))
    (alone,) = Generator(FakePrimitives(CFG)).run([good])
    bad, ok = g.run([Request([7, 8, POISON, 9], params=SamplingParams(max_tokens=12)), good])
    assert bad.finish == Finish.ERROR and "poisoned row" in bad.error
    assert ok.tokens == alone.tokens and ok.finish == alone.finish and ok.error is None


# -- the configuration ---------------------------------------------------------------------------


def test_scheduler_config_states_each_default_once_and_the_two_paths_read_it():
    from sf_trt.drafting import PromptLookupConfig
    from sf_trt.engine_loop import EngineLoop, LoopConfig
    from sf_trt.scheduler import SchedulerConfig
    from sf_trt.scheduler.config import SERVING_FIRST_TOKEN_TICK, SERVING_PREFILL_BUDGET, SERVING_TICK_TOKENS

    batch, serving = SchedulerConfig(), SchedulerConfig.serving()
    assert (batch.tick_tokens, batch.prefill_chunk, batch.prefill_budget, batch.first_token_tick) == (16, 256, None, False)
    assert (serving.tick_tokens, serving.prefill_chunk, serving.prefill_budget, serving.first_token_tick) == (
        SERVING_TICK_TOKENS, 256, SERVING_PREFILL_BUDGET, SERVING_FIRST_TOKEN_TICK)
    assert isinstance(batch.policy, LoadAwareDrafting) and isinstance(serving.policy, LoadAwareDrafting)
    assert Generator(FakePrimitives(CFG)).scheduler.config == batch
    assert EngineLoop(FakePrimitives(CFG)).scheduler.config == serving == LoopConfig().scheduler
    assert Generator(FakePrimitives(CFG), tick_tokens=3).scheduler.config.tick_tokens == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.tick_tokens = 2  # type: ignore[misc]
    pl = PromptLookupConfig(max_draft=3)
    assert SchedulerConfig(draft_config=pl).draft_configs == {"prompt_lookup": pl}
    assert SchedulerConfig(draft_config=[pl]).draft_config == (pl,)


@pytest.mark.parametrize("field, value", [("tick_tokens", 0), ("prefill_chunk", 1.5), ("prefill_budget", True), ("prefill_budget", 0)])
def test_scheduler_config_refuses_bad_settings_naming_them(field, value):
    from sf_trt.scheduler import SchedulerConfig

    with pytest.raises(StatusError) as err:
        SchedulerConfig(**{field: value})
    assert err.value.status == Status.BAD_ARGUMENT
    assert str(err.value) == f"SchedulerConfig: {field} must be an int >= 1 (got {value!r})"


@SETTINGS
@given(prompts=st.lists(texts, min_size=1, max_size=6), sampled=st.booleans(), speculate=st.booleans(),
       arrivals=st.lists(st.integers(0, 3), min_size=1, max_size=6), budget=st.sampled_from([None, 5, 16]))
def test_first_token_tick_reports_each_first_token_one_pass_after_its_prefill_and_changes_no_token(prompts, sampled, speculate, arrivals, budget):
    """With ``first_token_tick``, a request's first token comes alone, in an update whose tick ran
    that lane one pass. Requests arriving while others decode (0-3 before each step; more than the
    4 lanes: some wait) emit exactly the tokens they emit without it."""
    from sf_trt.scheduler import SchedulerConfig

    reqs = [request(t, sampled=sampled, speculate=speculate) for t in prompts]
    outs = {}
    for first_tick in (False, True):
        config = SchedulerConfig(tick_tokens=6, prefill_chunk=4, prefill_budget=budget, policy=DraftPolicy(), first_token_tick=first_tick)
        sched = Generator(FakePrimitives(CFG), config, tokenizer=TOK).scheduler
        seqs, firsts, steps = [], {}, 0
        while len(seqs) < len(reqs) or sched.has_work:
            arriving = arrivals[steps % len(arrivals)] or (0 if sched.has_work else 1)
            for r in reqs[len(seqs) : len(seqs) + arriving]:
                seqs.append(sched.add(r, seq_id=len(seqs)))
            passes_before = [s.passes for s in seqs]
            for u in sched.step():
                i = seqs.index(u.seq)
                if u.tokens and i not in firsts:
                    firsts[i] = (len(u.tokens), u.seq.passes - passes_before[i])
            steps += 1
        outs[first_tick] = [(s.tokens, s.finish) for s in seqs]
        if first_tick:
            assert set(firsts.values()) == {(1, 1)}, firsts
    assert outs[True] == outs[False]

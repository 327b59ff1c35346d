"""The Generator: continuous batching over the Executor changes no lane's tokens."""

from __future__ import annotations

import dataclasses

import pytest

from sf_trt.abi import Finish, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.faults import Fault, FaultyPrimitives
from sf_trt.generate import Generator, Request
from sf_trt.scheduler import DraftPolicy

CFG = FakeConfig(vocab=40, eos=39, copy_model=True, copy_miss_every=4, verify_rows=True, max_lanes=3, max_context=128)


def requests():
    out = []
    for i in range(7):
        prompt = [(i * 3 + k) % 9 for k in range(5 + i)] * 2
        params = SamplingParams(temperature=0.9, max_tokens=10 + 3 * i, flags=SamplingFlag.IGNORE_EOS if i % 2 else SamplingFlag(0))
        out.append(Request(prompt, Sampling.GPU_GUMBEL if i % 3 else Sampling.GPU_GREEDY, params, seed=i))
    return out


def test_more_requests_than_lanes_each_emit_what_they_emit_alone():
    gen = Generator(FakePrimitives(CFG), tick_tokens=4, prefill_chunk=3, policy=DraftPolicy())
    streamed: dict[int, list[int]] = {}
    together = gen.run(requests(), lambda i, new: streamed.setdefault(i, []).extend(new))
    for i, (req, res) in enumerate(zip(requests(), together)):
        (alone,) = Generator(FakePrimitives(CFG)).run([Request(req.prompt_ids, req.sampling, req.params, req.seed, speculate=False)])
        assert (res.tokens, res.finish) == (alone.tokens, alone.finish)
        assert streamed.get(i, []) == res.tokens
    assert sum(r.proposed for r in together) > 0
    gen.executor.check_integrity()
    assert gen.executor.lanes == []


def test_the_default_policy_sheds_drafts_in_a_full_batch_drafts_alone_and_changes_no_token():
    from sf_trt.scheduler import LoadAwareDrafting

    assert isinstance(Generator(FakePrimitives(CFG)).scheduler.policy, LoadAwareDrafting)
    reqs = requests()
    alone_plain = [alone(r) for r in reqs]
    one = [Generator(FakePrimitives(CFG)).run([r])[0] for r in reqs]  # one lane: drafts from its first tick
    full = Generator(FakePrimitives(dataclasses.replace(CFG, max_lanes=4)), policy=LoadAwareDrafting(row_budget=8)).run(reqs)
    for want, a, b in zip(alone_plain, one, full):
        assert (a.tokens, a.finish) == (b.tokens, b.finish) == (want.tokens, want.finish)
    assert all(r.proposed > 0 for r in one)
    assert sum(r.proposed for r in full) < sum(r.proposed for r in one)  # 4 lanes: a draft of 1 at most


def test_a_result_times_its_first_token():
    gen = Generator(FakePrimitives(CFG), tick_tokens=1)  # a token a tick: the first comes before the finish
    (res,) = gen.run([Request([1, 2, 3], params=SamplingParams(max_tokens=6, flags=SamplingFlag.IGNORE_EOS), speculate=False)])
    assert len(res.tokens) == 6 and 0 < res.first_token_s < res.seconds


def test_a_bad_request_is_refused_before_any_runs_and_leaves_nothing_behind():
    gen = Generator(FakePrimitives(CFG))
    with pytest.raises(StatusError) as err:
        gen.run([Request([1, 2, 3]), Request([])])
    assert err.value.status == Status.EMPTY_PROMPT
    assert gen.executor.lanes == [] and gen.executor.snapshot()[3] == ()
    assert len(gen.run([Request([1, 2, 3], params=SamplingParams(max_tokens=4))])[0].tokens) == 4


def test_each_request_chooses_its_drafter_and_scope_and_emits_what_it_emits_alone():
    gen = Generator(FakePrimitives(CFG), tick_tokens=5, prefill_chunk=4, policy=DraftPolicy())
    drafters = ["suffix", "suffix", "prompt-lookup", None, None, "suffix", "suffix"]  # None: no speculation
    scopes = ["", "t1", "t1", "t2", None, None, "t2"]
    reqs = [dataclasses.replace(r, speculate=d is not None, drafter=d or "prompt-lookup", draft_scope=s)
            for r, d, s in zip(requests(), drafters, scopes)]
    for _ in range(2):  # the second round drafts from the first round's corpus
        together = gen.run(reqs)
        for req, res in zip(reqs, together):
            (alone,) = Generator(FakePrimitives(CFG)).run([dataclasses.replace(req, speculate=False)])
            assert (res.tokens, res.finish) == (alone.tokens, alone.finish)
            if not req.speculate:
                assert res.proposed == 0
    corpus = gen.executor.shared_state(gen.scheduler.slot_of("suffix"))
    assert corpus.stats("")[1] == 2 and corpus.stats("t1")[1] == 2 and corpus.stats("t2")[1] == 2, "suffix lanes only, private ones not"
    gen.executor.check_integrity()


# -- refusals and faults -----------------------------------------------------------------


def alone(req: Request):
    (res,) = Generator(FakePrimitives(CFG)).run([dataclasses.replace(req, speculate=False)])
    return res


def test_the_refusal_that_happened_surfaces_and_nothing_runs():
    """A top_k past the sampler's limit (40 here) is refused as such, before any
    request runs, even when the bad request would be admitted last."""
    gen = Generator(FakePrimitives(CFG))
    streamed: list = []
    bad = Request([1, 2, 3], Sampling.GPU_GUMBEL, SamplingParams(top_k=41))
    with pytest.raises(StatusError) as err:
        gen.run(requests() + [bad], lambda i, new: streamed.append(i))
    assert err.value.status == Status.BAD_SAMPLING_PARAMS
    assert str(err.value) == "request 7: top_k 41 exceeds the sampler's limit 40"
    assert streamed == [] and gen.executor.lanes == [] and gen.executor.snapshot()[3] == ()
    assert gen.run([Request([1, 2, 3], params=SamplingParams(max_tokens=4))])[0].finish == Finish.LENGTH


def test_an_interrupted_run_frees_its_lanes_and_its_exception_is_the_one_raised():
    gen = Generator(FakePrimitives(CFG), tick_tokens=2)

    def stop(i, new):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gen.run(requests(), stop)
    assert gen.executor.lanes == []
    gen.executor.check_integrity()


def test_a_faulted_request_ends_with_its_error_and_the_others_finish_normally():
    prims = FaultyPrimitives(FakePrimitives(CFG), [Fault("decode", 9)])
    results = Generator(prims, tick_tokens=4, prefill_chunk=3).run(requests())
    assert prims.fired == ["decode #9: raise"]
    failed = [i for i, r in enumerate(results) if r.finish == Finish.ERROR]
    assert failed and len(failed) < len(results)
    for i, (req, res) in enumerate(zip(requests(), results)):
        want = alone(req)
        if i in failed:
            assert res.error.startswith("decode forward (lane") and "InjectedFault: injected before decode #9" in res.error
            assert res.tokens == want.tokens[: len(res.tokens)]
        else:
            assert (res.tokens, res.finish, res.error) == (want.tokens, want.finish, None)


def test_a_failed_release_cuts_nothing_and_the_slot_serves_again():
    cfg = dataclasses.replace(CFG, max_lanes=1)
    prims = FaultyPrimitives(FakePrimitives(cfg), [Fault("release", 1)])
    results = Generator(prims).run(requests()[:3])
    for req, res in zip(requests()[:3], results):
        want = alone(req)
        assert (res.tokens, res.finish) == (want.tokens, want.finish)
    assert results[0].error.startswith("release (lane 0): InjectedFault")
    assert results[1].error is None and results[2].error is None


def test_when_every_slot_stays_quarantined_the_waiting_requests_end_with_the_reason():
    cfg = dataclasses.replace(CFG, max_lanes=1)
    prims = FaultyPrimitives(FakePrimitives(cfg), [Fault("release", n) for n in range(1, 50)])
    gen = Generator(prims)
    first, second = gen.run(requests()[:2])
    assert first.tokens == alone(requests()[0]).tokens and first.error.startswith("release (lane 0)")
    assert second.finish == Finish.ERROR and second.tokens == []
    assert second.error.startswith("scheduler: every lane slot is quarantined after a failed release (release (lane 0)")
    with pytest.raises(StatusError) as err:  # a later run is refused up front, saying why
        gen.run(requests()[:1])
    assert err.value.status == Status.CAPACITY_EXHAUSTED and "1 quarantined" in str(err.value)


@pytest.mark.parametrize("tick_tokens", [0, 2.5, True])
def test_generator_settings_are_checked(tick_tokens):
    with pytest.raises(StatusError, match="SchedulerConfig: tick_tokens must be an int >= 1"):
        Generator(FakePrimitives(CFG), tick_tokens=tick_tokens)


def run_one(cfg: FakeConfig = CFG, **request) -> list:
    return Generator(FakePrimitives(cfg)).run([Request([1, 2, 3], **request)])


REFUSALS = {
    "generator tick tokens 0": lambda: Generator(FakePrimitives(CFG), tick_tokens=0),
    "generator first token tick not a bool": lambda: Generator(FakePrimitives(CFG), first_token_tick=1),
    "generator draft config of no kind": lambda: Generator(FakePrimitives(CFG), draft_config={"max_draft": 4}),
    "generator request drafter unknown": lambda: run_one(drafter="eagle"),
    "generator request drafter not a name": lambda: run_one(drafter=3),
    "generator speculation the backend cannot verify": lambda: run_one(FakeConfig(copy_model=True)),
    "generator request top_k past the limit": lambda: run_one(sampling=Sampling.GPU_GUMBEL, params=SamplingParams(top_k=41)),
}
"""Every refusal of the Generator as a call that raises it, by the name docs/errors.md gives it."""


@pytest.mark.parametrize("case", list(REFUSALS))
def test_generator_refusals_raise_a_status_error_and_run_nothing(case):
    with pytest.raises(StatusError):
        REFUSALS[case]()


def test_an_unknown_drafter_is_refused_before_any_request_runs():
    gen = Generator(FakePrimitives(CFG))
    with pytest.raises(StatusError) as err:
        gen.run([Request([1, 2, 3]), Request([1, 2, 3], drafter="eagle")])
    assert err.value.status == Status.BAD_ARGUMENT and str(err.value).startswith("request 1: unknown drafter 'eagle'")
    assert gen.executor.lanes == [] and gen.executor.snapshot()[3] == ()


def test_a_bad_draft_scope_is_refused_before_any_request_runs():
    gen = Generator(FakePrimitives(CFG))
    with pytest.raises(StatusError) as err:
        gen.run([Request([1, 2, 3]), Request([1, 2, 3], draft_scope="k" * 1025)])
    assert err.value.status == Status.BAD_ARGUMENT
    assert str(err.value) == "request 1: draft_scope must be None or a str of at most 1024 characters (got a str of 1025 characters)"
    assert gen.executor.lanes == [] and gen.executor.snapshot()[3] == ()

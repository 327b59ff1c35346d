"""The Generator: continuous batching over the Executor changes no lane's tokens."""

from __future__ import annotations

import dataclasses

import pytest

from sf_trt.abi import Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.generate import Generator, Request

CFG = FakeConfig(vocab=40, eos=39, copy_model=True, copy_miss_every=4, verify_rows=True, max_lanes=3, max_context=128)


def requests():
    out = []
    for i in range(7):
        prompt = [(i * 3 + k) % 9 for k in range(5 + i)] * 2
        params = SamplingParams(temperature=0.9, max_tokens=10 + 3 * i, flags=SamplingFlag.IGNORE_EOS if i % 2 else SamplingFlag(0))
        out.append(Request(prompt, Sampling.GPU_GUMBEL if i % 3 else Sampling.GPU_GREEDY, params, seed=i))
    return out


def test_more_requests_than_lanes_each_emit_what_they_emit_alone():
    gen = Generator(FakePrimitives(CFG), tick_tokens=4, prefill_chunk=3)
    streamed: dict[int, list[int]] = {}
    together = gen.run(requests(), lambda i, new: streamed.setdefault(i, []).extend(new))
    for i, (req, res) in enumerate(zip(requests(), together)):
        (alone,) = Generator(FakePrimitives(CFG)).run([Request(req.prompt_ids, req.sampling, req.params, req.seed, speculate=False)])
        assert (res.tokens, res.finish) == (alone.tokens, alone.finish)
        assert streamed.get(i, []) == res.tokens
    assert sum(r.proposed for r in together) > 0
    gen.executor.check_integrity()
    assert gen.executor.lanes == []


def test_a_bad_request_is_refused_before_any_runs_and_leaves_nothing_behind():
    gen = Generator(FakePrimitives(CFG))
    with pytest.raises(StatusError) as err:
        gen.run([Request([1, 2, 3]), Request([])])
    assert err.value.status == Status.EMPTY_PROMPT
    assert gen.executor.lanes == [] and gen.executor.snapshot()[3] == ()
    assert len(gen.run([Request([1, 2, 3], params=SamplingParams(max_tokens=4))])[0].tokens) == 4


def test_each_request_chooses_its_drafter_and_scope_and_emits_what_it_emits_alone():
    gen = Generator(FakePrimitives(CFG), tick_tokens=5, prefill_chunk=4, speculate="suffix")
    kinds = [True, "suffix", "prompt_lookup", False, "none", "suffix", True]
    scopes = ["", "t1", "t1", "t2", None, None, "t2"]
    reqs = [dataclasses.replace(r, speculate=k, draft_scope=s) for r, k, s in zip(requests(), kinds, scopes)]
    for _ in range(2):  # the second round drafts from the first round's corpus
        together = gen.run(reqs)
        for req, res in zip(reqs, together):
            (alone,) = Generator(FakePrimitives(CFG)).run([dataclasses.replace(req, speculate=False)])
            assert (res.tokens, res.finish) == (alone.tokens, alone.finish)
            if req.speculate in (False, "none"):
                assert res.proposed == 0
    corpus = gen.executor.shared_state(gen.slots["suffix"])
    assert corpus.stats("")[1] == 2 and corpus.stats("t1")[1] == 2 and corpus.stats("t2")[1] == 2, "suffix lanes only, private ones not"
    gen.executor.check_integrity()


@pytest.mark.parametrize("speculate, status, words", [
    ("eagle", Status.BAD_ARGUMENT, "request 1: speculate='eagle' is not a drafter kind"),
    (3, Status.BAD_ARGUMENT, "request 1: speculate=3"),
])
def test_an_unknown_drafter_is_refused_before_any_request_runs(speculate, status, words):
    gen = Generator(FakePrimitives(CFG))
    with pytest.raises(StatusError) as err:
        gen.run([Request([1, 2, 3]), Request([1, 2, 3], speculate=speculate)])
    assert err.value.status == status and words in str(err.value)
    assert gen.executor.lanes == [] and gen.executor.snapshot()[3] == ()
    with pytest.raises(StatusError, match="speculate='eagle' is not a drafter kind"):
        Generator(FakePrimitives(CFG), speculate="eagle")
    with pytest.raises(StatusError, match="draft_config dict is no drafter kind's config"):
        Generator(FakePrimitives(CFG), draft_config={"max_draft": 4})

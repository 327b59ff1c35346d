"""Every refusal of a plan, a prompt or a registration: its own Status, a message naming what was wrong, nothing lost.

Every case here is a row of docs/errors.md (``REFUSALS``; tests/test_docs_errors.py
checks the table's Status and message against it).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
from lanes import DIGEST, ID

from sf_trt.abi import CertMode, Exactness, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.drafting import PromptLookupConfig, SuffixConfig
from sf_trt.engine import TokenRef
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.strategies import KINDS, register_drafter_kind
from sf_trt.testing import Harness, register_drafter_with, register_prompt_lookup_with

CFG = FakeConfig(vocab=64, eos=63, copy_model=True, verify_rows=True, max_lanes=3, max_context=32, top_k_limit=16)


BYSTANDER = 7


def setup():
    """A harness with lane 7 speculating mid-generation, and a 3-token prompt."""
    h = Harness.with_engine(Executor(FakePrimitives(CFG), ExecutorConfig(ring_capacity=64)))
    slot, _ = register_prompt_lookup_with(h, ID, DIGEST, 0)
    p = h.prompt([1, 2, 3])
    b = h.prompt([4, 5, 6, 4, 5])
    params = SamplingParams(temperature=0.9, flags=SamplingFlag.IGNORE_EOS)
    h.tick_ok(h.plan().admit(BYSTANDER, b, strategy_slot=slot, sampling=Sampling.GPU_GUMBEL, params=params, rng_counter_base=3).prefill(BYSTANDER, 0, 5).decode(BYSTANDER, 4))
    return h, p, slot


CASES = {
    "unknown lane": (lambda h, p, s: h.plan().decode(3, 4), Status.UNKNOWN_LANE, "decode(lane=3)"),
    "lane admitted twice in a plan": (lambda h, p, s: h.plan().admit(1, p).admit(1, p), Status.LANE_ALREADY_ADMITTED, "admit(lane=1)"),
    "lane already live": (lambda h, p, s: h.plan().admit(BYSTANDER, p), Status.LANE_ALREADY_ADMITTED, "admit(lane=7)"),
    "unknown prompt": (lambda h, p, s: h.plan().admit(1, 999), Status.UNKNOWN_PROMPT, "admit(lane=1)"),
    "prefill out of order": (lambda h, p, s: h.plan().admit(1, p).prefill(1, 1, 2), Status.PREFILL_OUT_OF_ORDER, "prefill(lane=1"),
    "prefill past the prompt": (lambda h, p, s: h.plan().admit(1, p).prefill(1, 0, 4), Status.PREFILL_OUT_OF_RANGE, "prefill(lane=1"),
    "prefill of nothing": (lambda h, p, s: h.plan().admit(1, p).prefill(1, 0, 0), Status.PREFILL_OUT_OF_RANGE, "prefill(lane=1"),
    "decode before prefill": (lambda h, p, s: h.plan().admit(1, p).prefill(1, 0, 2).decode(1, 4), Status.DECODE_BEFORE_PREFILL, "decode(lane=1"),
    "decode of nothing": (lambda h, p, s: h.plan().decode(BYSTANDER, 0), Status.DECODE_OUT_OF_RANGE, "decode(lane=7"),
    "decode past the ring": (lambda h, p, s: h.plan().decode(BYSTANDER, 65), Status.DECODE_OUT_OF_RANGE, "decode(lane=7"),
    "decode twice": (lambda h, p, s: h.plan().decode(BYSTANDER, 1).decode(BYSTANDER, 1), Status.DUPLICATE_OP, "decode(lane=7"),
    "op after release": (lambda h, p, s: h.plan().release(BYSTANDER).decode(BYSTANDER, 1), Status.DUPLICATE_OP, "decode(lane=7)"),
    "ungranted slot": (lambda h, p, s: h.plan().admit(1, p, strategy_slot=9), Status.REJECT_ILLEGAL_COMBINATION, "admit(lane=1)"),
    "draft scope not a str": (lambda h, p, s: h.plan().admit(1, p, strategy_slot=s, draft_scope=5), Status.BAD_ARGUMENT, "admit(lane=1): draft_scope"),
    "draft scope too long": (lambda h, p, s: h.plan().admit(1, p, draft_scope="k" * 1025), Status.BAD_ARGUMENT, "1025 characters"),
    "prefix not cached": (lambda h, p, s: h.plan().admit(1, p, cached_len=16), Status.PREFIX_NOT_CACHED, "admit(lane=1): cached_len 16"),
    "cached length negative": (lambda h, p, s: h.plan().admit(1, p, cached_len=-1), Status.BAD_ARGUMENT, "admit(lane=1): cached_len"),
    "prompt logprobs from a cached prefix": (
        lambda h, p, s: h.plan().admit(1, p, cached_len=16, prompt_logprobs=2), Status.BAD_ARGUMENT, "admit(lane=1): prompt_logprobs 2",
    ),
    "gumbel at temperature 0": (
        lambda h, p, s: h.plan().admit(1, p, sampling=Sampling.GPU_GUMBEL, params=SamplingParams(temperature=0.0)),
        Status.BAD_SAMPLING_PARAMS, "admit(lane=1)",
    ),
    "top_k past the sampler's limit": (
        lambda h, p, s: h.plan().admit(1, p, sampling=Sampling.GPU_GUMBEL, params=SamplingParams(top_k=17)),
        Status.BAD_SAMPLING_PARAMS, "admit(lane=1)",
    ),
    "logit_bias past the vocabulary": (
        lambda h, p, s: h.plan().admit(1, p, params=SamplingParams(logit_bias={64: 1.0})), Status.BAD_SAMPLING_PARAMS, "admit(lane=1): logit_bias",
    ),
    "prompt_logprobs out of range": (
        lambda h, p, s: h.plan().admit(1, p, prompt_logprobs=21), Status.BAD_ARGUMENT, "admit(lane=1): prompt_logprobs",
    ),
    "negative rng counter base": (lambda h, p, s: h.plan().admit(1, p, rng_counter_base=-1), Status.BAD_SAMPLING_PARAMS, "admit(lane=1)"),
    "params of the wrong type": (lambda h, p, s: h.plan().admit(1, p, params={"temperature": 1}), Status.BAD_SAMPLING_PARAMS, "admit(lane=1)"),
    "unknown sampling mode": (lambda h, p, s: h.plan().admit(1, p, sampling=5), Status.BAD_SAMPLING_MODE, "admit(lane=1)"),
    "out of lane slots": (lambda h, p, s: h.plan().admit(1, p).admit(2, p).admit(3, p), Status.CAPACITY_EXHAUSTED, "admit(lane=3)"),
    "lane id not an int": (lambda h, p, s: h.plan().decode("7", 1), Status.BAD_ARGUMENT, "decode(lane='7')"),
    "a bad op after good ones": (
        lambda h, p, s: h.plan().admit(1, p).prefill(1, 0, 3).decode(1, 2).decode(BYSTANDER, 3).decode(9, 1),
        Status.UNKNOWN_LANE, "decode(lane=9)",
    ),
    "lane id a bool": (lambda h, p, s: h.plan().admit(True, p), Status.BAD_ARGUMENT, "admit(lane=True)"),
    "prompt id a bool": (lambda h, p, s: h.plan().admit(1, True), Status.BAD_ARGUMENT, "admit(lane=1)"),
    "prompt id a float": (lambda h, p, s: h.plan().admit(1, float(p)), Status.BAD_ARGUMENT, "admit(lane=1)"),
    "strategy slot a bool": (lambda h, p, s: h.plan().admit(1, p, strategy_slot=True), Status.BAD_ARGUMENT, "admit(lane=1)"),
    "strategy slot a float": (lambda h, p, s: h.plan().admit(1, p, strategy_slot=float(s)), Status.BAD_ARGUMENT, "admit(lane=1)"),
    "sampling mode a bool": (lambda h, p, s: h.plan().admit(1, p, sampling=True), Status.BAD_SAMPLING_MODE, "admit(lane=1)"),
    "rng counter base a float": (lambda h, p, s: h.plan().admit(1, p, rng_counter_base=3.0), Status.BAD_SAMPLING_PARAMS, "admit(lane=1)"),
    "rng counter base a bool": (lambda h, p, s: h.plan().admit(1, p, rng_counter_base=True), Status.BAD_SAMPLING_PARAMS, "admit(lane=1)"),
    "prefill bounds as bools": (lambda h, p, s: h.plan().admit(1, p).prefill(1, False, True), Status.PREFILL_OUT_OF_RANGE, "prefill(lane=1"),
    "decode count a bool": (lambda h, p, s: h.plan().decode(BYSTANDER, True), Status.DECODE_OUT_OF_RANGE, "decode(lane=7"),
}


def continue_bystander(h: Harness) -> list[int]:
    e = h.tick_ok(h.plan().decode(BYSTANDER, 12)).emit_for(BYSTANDER)
    return h.rings_tokens(e.token_ref)


@pytest.mark.parametrize("case", list(CASES))
def test_a_refused_tick_names_what_was_wrong_and_loses_nothing(case):
    build, status, op = CASES[case]
    h, p, slot = setup()
    assert h.tick_err(build(h, p, slot)) == status
    assert op in str(h.last_error), str(h.last_error)
    control, _, _ = setup()
    assert continue_bystander(h) == continue_bystander(control), "the bystander lane continues as if nothing happened"
    # and the refused plan's lanes are free to be admitted properly now
    h.tick_ok(h.plan().admit(1, p).prefill(1, 0, 3).decode(1, 2))


def test_every_refusal_has_its_own_status():
    statuses = [status for _, status, _ in CASES.values()]
    assert len(set(statuses)) >= 13


PROMPTS = {
    "empty prompt": ([], Status.EMPTY_PROMPT),
    "token past the vocabulary": ([1, 64, 2], Status.TOKEN_OUT_OF_VOCAB),
    "negative token": ([1, -1], Status.TOKEN_OUT_OF_VOCAB),
    "prompt filling the context": (list(range(32)), Status.PROMPT_TOO_LONG),
    "float tokens": ([1.5, 2.0], Status.BAD_ARGUMENT),
    "a bool among the tokens": ([1, True, 2], Status.BAD_ARGUMENT),
    "tokens not a 1-D sequence": ([[1, 2]], Status.BAD_ARGUMENT),
}


@pytest.mark.parametrize("case", list(PROMPTS))
def test_bad_prompts_are_refused_at_registration(case):
    tokens, status = PROMPTS[case]
    h, _, _ = setup()
    before = h.engine.snapshot()
    with pytest.raises(StatusError) as err:
        h.prompt(tokens)
    assert err.value.status == status
    assert str(err.value).startswith("prompt:")
    assert h.engine.snapshot() == before


def no_verify_rows() -> Harness:
    return Harness.with_engine(Executor(FakePrimitives(FakeConfig(copy_model=True)), ExecutorConfig()))


def no_state_io() -> FakePrimitives:
    """A fake that says it cannot save or load its state (as TensorRT says)."""
    f = FakePrimitives(CFG)
    f.capabilities = dataclasses.replace(f.capabilities, state_bytes_per_token=0)
    return f


OTHERS = {
    "kernel capability not offered": lambda: register_prompt_lookup_with(setup()[0], ID, DIGEST, 2),
    "strategy id of the wrong size": lambda: register_prompt_lookup_with(setup()[0], b"short", DIGEST, 0),
    "speculation without verify rows": lambda: register_prompt_lookup_with(no_verify_rows(), ID, DIGEST, 0),
    "speculation without partial rollback": lambda: register_prompt_lookup_with(
        Harness.with_engine(Executor(FakePrimitives(dataclasses.replace(CFG, truncate_partial=False)))), ID, DIGEST, 0
    ),
    "unknown strategy kind": lambda: setup()[0].engine.register_strategy("medusa", ID, DIGEST),
    "strategy config of the wrong type": lambda: setup()[0].engine.register_strategy("prompt_lookup", ID, DIGEST, 0, {"max_draft": 4}),
    "draft n-gram sizes out of order": lambda: PromptLookupConfig(ngram_min=3, ngram_max=2),
    "draft length 0": lambda: PromptLookupConfig(max_draft=0),
    "suffix drafting without partial rollback": lambda: register_drafter_with(
        Harness.with_engine(Executor(FakePrimitives(dataclasses.replace(CFG, truncate_partial=False)))), "suffix", ID, DIGEST, 0
    ),
    "strategy config of another kind": lambda: register_drafter_with(setup()[0], "suffix", ID, DIGEST, 0, PromptLookupConfig()),
    "suffix match window 0": lambda: SuffixConfig(max_match=0),
    "suffix minimum match past the window": lambda: SuffixConfig(max_match=8, min_match=9),
    "suffix minimum odds above 1": lambda: SuffixConfig(min_prob=1.5),
    "suffix corpus of no generations": lambda: SuffixConfig(corpus_generations=0),
    "drafter kind name taken": lambda: register_drafter_kind("suffix", SuffixConfig, lambda *a: None),
    "shared state of an ungranted slot": lambda: setup()[0].engine.shared_state(9),
    "ring capacity 0": lambda: ExecutorConfig(ring_capacity=0),
    "ring capacity a float": lambda: ExecutorConfig(ring_capacity=64.0),
    "prefill rows 0": lambda: ExecutorConfig(max_prefill_rows=0),
    "prefix cache budget negative": lambda: ExecutorConfig(prefix_cache_mb=-1),
    "prefix cache on a backend without state io": lambda: Executor(no_state_io(), ExecutorConfig(prefix_cache_mb=64)),
    "cached prefix of an unknown prompt": lambda: setup()[0].engine.cached_prefix(999, ""),
    "fake vocabulary too small": lambda: FakePrimitives(FakeConfig(vocab=2, eos=1)),
    "fake favour logit NaN": lambda: FakePrimitives(FakeConfig(favour_logit=math.nan)),
    "read tokens of no ring": lambda: setup()[0].engine.read_tokens(TokenRef(99, 0, 1)),
    "read tokens past what was written": lambda: setup()[0].engine.read_tokens(TokenRef(0, 0, 1000)),
    "drop an unknown prompt": lambda: setup()[0].engine.drop_prompt(999),
    "drop prompt id a bool": lambda: setup()[0].engine.drop_prompt(True),
    "tokens of an unknown lane": lambda: setup()[0].engine.lane_tokens(3),
}


@pytest.mark.parametrize("case", list(OTHERS))
def test_registration_configuration_and_reads_refuse_bad_input(case):
    with pytest.raises(StatusError):
        OTHERS[case]()


def _refused_plan(case: str) -> None:
    h, p, slot = setup()
    h.tick_err(CASES[case][0](h, p, slot))
    raise h.last_error


REFUSALS = {
    **{case: functools.partial(_refused_plan, case) for case in CASES},
    **{case: (lambda tokens: lambda: setup()[0].prompt(tokens))(tokens) for case, (tokens, _) in PROMPTS.items()},
    **OTHERS,
}
"""Every refusal above as a call that raises it, by the name docs/errors.md gives it."""


def test_every_drafter_kind_is_certified_exact_the_same_way():
    h, _, _ = setup()
    for kind in KINDS:
        slot, certs = register_drafter_with(h, kind, ID, DIGEST, 0)
        assert slot != 0
        assert [(c.exactness, c.sampling_modes) for c in certs] == [(Exactness.DISTRIBUTION_EXACT, CertMode.GREEDY | CertMode.GUMBEL)]

"""Bad input gets a clear refusal and loses nothing.

One case per refusal: the Status, a message that names the op, and the other
lanes untouched (a lane running beside the refused tick continues exactly as it
would have without it). The harness also checks that the refused tick changed
nothing at all.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from sf_trt.abi import CertMode, Exactness, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.drafting import PromptLookupConfig
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.primitives import Rows
from sf_trt.strategies import KINDS
from sf_trt.testing import Harness, register_drafter_with, register_prompt_lookup_with

from lanes import DIGEST, ID

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
    "gumbel at temperature 0": (
        lambda h, p, s: h.plan().admit(1, p, sampling=Sampling.GPU_GUMBEL, params=SamplingParams(temperature=0.0)),
        Status.BAD_SAMPLING_PARAMS, "admit(lane=1)",
    ),
    "top_k past the sampler's limit": (
        lambda h, p, s: h.plan().admit(1, p, sampling=Sampling.GPU_GUMBEL, params=SamplingParams(top_k=17)),
        Status.BAD_SAMPLING_PARAMS, "admit(lane=1)",
    ),
    "negative rng counter base": (lambda h, p, s: h.plan().admit(1, p, rng_counter_base=-1), Status.BAD_SAMPLING_PARAMS, "admit(lane=1)"),
    "params of the wrong type": (lambda h, p, s: h.plan().admit(1, p, params={"temperature": 1}), Status.BAD_SAMPLING_PARAMS, "admit(lane=1)"),
    "unknown sampling mode": (lambda h, p, s: h.plan().admit(1, p, sampling=5), Status.BAD_SAMPLING_MODE, "admit(lane=1)"),
    "out of lane slots": (lambda h, p, s: h.plan().admit(1, p).admit(2, p).admit(3, p), Status.CAPACITY_EXHAUSTED, "admit(lane=3)"),
    "lane id not an int": (lambda h, p, s: h.plan().decode("7", 1), Status.BAD_ARGUMENT, "decode(lane='7')"),
    "draft scope not a str": (lambda h, p, s: h.plan().admit(1, p, strategy_slot=s, draft_scope=5), Status.BAD_ARGUMENT, "admit(lane=1): draft_scope"),
    "draft scope too long": (lambda h, p, s: h.plan().admit(1, p, draft_scope="k" * 1025), Status.BAD_ARGUMENT, "1025 characters"),
    "a bad op after good ones": (
        lambda h, p, s: h.plan().admit(1, p).prefill(1, 0, 3).decode(1, 2).decode(BYSTANDER, 3).decode(9, 1),
        Status.UNKNOWN_LANE, "decode(lane=9)",
    ),
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


@pytest.mark.parametrize(
    "tokens, status",
    [([], Status.EMPTY_PROMPT), ([1, 64, 2], Status.TOKEN_OUT_OF_VOCAB), ([1, -1], Status.TOKEN_OUT_OF_VOCAB),
     (list(range(32)), Status.PROMPT_TOO_LONG), ([1.5, 2.0], Status.BAD_ARGUMENT)],
)
def test_bad_prompts_are_refused_at_registration(tokens, status):
    h, _, _ = setup()
    before = h.engine.snapshot()
    with pytest.raises(StatusError) as err:
        h.prompt(tokens)
    assert err.value.status == status
    assert str(err.value).startswith("prompt:")
    assert h.engine.snapshot() == before


@pytest.mark.parametrize(
    "kwargs, field",
    [(dict(temperature=math.nan), "temperature"), (dict(temperature=-0.1), "temperature"), (dict(top_p=0.0), "top_p"),
     (dict(top_p=1.5), "top_p"), (dict(top_p=math.nan), "top_p"), (dict(top_k=-1), "top_k"),
     (dict(max_tokens=-1), "max_tokens"), (dict(top_k=1.5), "top_k"), (dict(flags=8), "flags")],
)
def test_sampling_params_refuse_bad_values(kwargs, field):
    with pytest.raises(StatusError) as err:
        SamplingParams(**kwargs)
    assert err.value.status == Status.BAD_SAMPLING_PARAMS
    assert "SamplingParams" in str(err.value) and field in str(err.value)


def test_registration_refusals_say_why():
    h, _, _ = setup()
    with pytest.raises(StatusError, match=r"register_strategy\(prompt_lookup\): kernel capability 0x2"):
        register_prompt_lookup_with(h, ID, DIGEST, 2)
    with pytest.raises(StatusError, match="strategy_id must be 32 bytes"):
        register_prompt_lookup_with(h, b"short", DIGEST, 0)
    no_rows = Harness.with_engine(Executor(FakePrimitives(FakeConfig(copy_model=True)), ExecutorConfig()))
    with pytest.raises(StatusError, match="verify_rows=False"):
        register_prompt_lookup_with(no_rows, ID, DIGEST, 0)
    with pytest.raises(StatusError, match=r"register_strategy\(suffix\): the backend cannot roll"):
        no_rollback = FakePrimitives(FakeConfig(copy_model=True, verify_rows=True, truncate_partial=False))
        register_drafter_with(Harness.with_engine(Executor(no_rollback, ExecutorConfig())), "suffix", ID, DIGEST, 0)
    with pytest.raises(StatusError, match=r"register_strategy\(suffix\): config must be a SuffixConfig \(got PromptLookupConfig\)"):
        register_drafter_with(h, "suffix", ID, DIGEST, 0, PromptLookupConfig())
    with pytest.raises(StatusError, match=r"unknown strategy kind \(known: \['prompt_lookup', 'suffix'\]\)"):
        register_drafter_with(h, "eagle", ID, DIGEST, 0)


def test_every_drafter_kind_is_certified_exact_the_same_way():
    h, _, _ = setup()
    for kind in KINDS:
        slot, certs = register_drafter_with(h, kind, ID, DIGEST, 0)
        assert slot != 0
        assert [(c.exactness, c.sampling_modes) for c in certs] == [(Exactness.DISTRIBUTION_EXACT, CertMode.GREEDY | CertMode.GUMBEL)]


# -- the primitives' seam ------------------------------------------------------------


def rows(lanes, positions, tokens, logit_rows=()):
    a = lambda v: np.asarray(v, np.int64)  # noqa: E731
    return Rows(a(lanes), a(positions), a(tokens), a(logit_rows))


@pytest.mark.parametrize(
    "call, status, words",
    [
        (lambda f: f.forward(rows([0], [1], [5])), Status.BAD_ARGUMENT, "expected 0"),
        (lambda f: f.forward(rows([0], [0], [64])), Status.TOKEN_OUT_OF_VOCAB, "outside 0..63"),
        (lambda f: f.forward(rows([5], [0], [1])), Status.BAD_ARGUMENT, "slot outside"),
        (lambda f: f.forward(rows([0], [32], [1])), Status.CAPACITY_EXHAUSTED, "position outside"),
        (lambda f: f.forward(rows([0, 0], [0, 1], [1])), Status.BAD_ARGUMENT, "differ in length"),
        (lambda f: f.forward(rows([0], [0], [1], [1])), Status.BAD_ARGUMENT, "logit_rows"),
        (lambda f: f.forward(Rows(np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(0))), Status.BAD_ARGUMENT, "integer"),
        (lambda f: f.truncate(0, 3), Status.BAD_ARGUMENT, "outside 0..0"),
    ],
)
def test_the_primitives_check_every_call_once(call, status, words):
    f = FakePrimitives(CFG)
    with pytest.raises(StatusError) as err:
        call(f)
    assert err.value.status == status and words in str(err.value), str(err.value)
    assert all(f.state_len(s) == 0 for s in range(CFG.max_lanes)), "a refused call changes nothing"


def test_a_backend_without_partial_rollback_refuses_one():
    import dataclasses

    f = FakePrimitives(dataclasses.replace(CFG, truncate_partial=False))
    f.forward(rows([0, 0, 0], [0, 1, 2], [1, 2, 3]))
    with pytest.raises(StatusError) as err:
        f.truncate(0, 1)
    assert err.value.status == Status.UNSUPPORTED
    assert f.state_len(0) == 3
    f.truncate(0, 0)


def test_a_backend_without_verify_rows_gives_logits_only_at_each_lanes_last_row():
    import dataclasses

    f = FakePrimitives(dataclasses.replace(CFG, verify_rows=False))
    with pytest.raises(StatusError) as err:
        f.forward(rows([0, 0], [0, 1], [1, 2], [0, 1]))
    assert err.value.status == Status.UNSUPPORTED
    assert f.forward(rows([0, 0], [0, 1], [1, 2], [1])).shape == (1, 64)

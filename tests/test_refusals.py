"""Bad input gets a clear refusal and loses nothing.

One case per refusal: the Status, a message that names the op, and the other
lanes untouched (a lane running beside the refused tick continues exactly as it
would have without it). The harness also checks that the refused tick changed
nothing at all. Every case is a row of docs/errors.md, which the last tests read:
the table gives each refusal's Status and exact message, and cannot drift.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import numpy as np
import pytest

from sf_trt.abi import TEMPERATURE_MIN, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.drafting import PromptLookupConfig
from sf_trt.engine import TokenRef
from sf_trt.executor import Executor, ExecutorConfig
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.faults import Fault
from sf_trt.generate import Generator, Request
from sf_trt.primitives import Rows, SampleRows
from sf_trt.testing import Harness, register_prompt_lookup_with

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


SAMPLING = {
    "temperature NaN": (dict(temperature=math.nan), "temperature"),
    "temperature infinite": (dict(temperature=math.inf), "temperature"),
    "temperature negative": (dict(temperature=-0.1), "temperature"),
    "temperature below the floor": (dict(temperature=1e-40), "temperature"),
    "temperature just below the floor": (dict(temperature=TEMPERATURE_MIN / 2), "temperature"),
    "temperature past float32": (dict(temperature=1e39), "temperature"),
    "temperature a string": (dict(temperature="1"), "temperature"),
    "top_p 0": (dict(top_p=0.0), "top_p"),
    "top_p above 1": (dict(top_p=1.5), "top_p"),
    "top_p NaN": (dict(top_p=math.nan), "top_p"),
    "top_k negative": (dict(top_k=-1), "top_k"),
    "top_k a float": (dict(top_k=1.5), "top_k"),
    "max_tokens negative": (dict(max_tokens=-1), "max_tokens"),
    "max_tokens a bool": (dict(max_tokens=True), "max_tokens"),
    "unknown flags": (dict(flags=8), "flags"),
}


@pytest.mark.parametrize("case", list(SAMPLING))
def test_sampling_params_refuse_bad_values(case):
    kwargs, field = SAMPLING[case]
    with pytest.raises(StatusError) as err:
        SamplingParams(**kwargs)
    assert err.value.status == Status.BAD_SAMPLING_PARAMS
    assert "SamplingParams" in str(err.value) and field in str(err.value)


def test_the_temperature_floor_itself_is_sampled_at():
    h, p, _ = setup()
    params = SamplingParams(temperature=TEMPERATURE_MIN, flags=SamplingFlag.IGNORE_EOS)
    e = h.tick_ok(h.plan().admit(1, p, sampling=Sampling.GPU_GUMBEL, params=params).prefill(1, 0, 3).decode(1, 5)).emit_for(1)
    greedy = h.tick_ok(h.plan().admit(2, p, params=params).prefill(2, 0, 3).decode(2, 5)).emit_for(2)
    assert h.rings_tokens(e.token_ref) == h.rings_tokens(greedy.token_ref), "at the floor, sampling is sharp"


def no_verify_rows():
    return Harness.with_engine(Executor(FakePrimitives(FakeConfig(copy_model=True)), ExecutorConfig()))


def run_request(cfg: FakeConfig = CFG, **kwargs):
    return Generator(FakePrimitives(cfg)).run([Request([1, 2, 3], **kwargs)])


OTHERS = {
    "kernel capability not offered": lambda: register_prompt_lookup_with(setup()[0], ID, DIGEST, 2),
    "strategy id of the wrong size": lambda: register_prompt_lookup_with(setup()[0], b"short", DIGEST, 0),
    "speculation without verify rows": lambda: register_prompt_lookup_with(no_verify_rows(), ID, DIGEST, 0),
    "speculation without partial rollback": lambda: register_prompt_lookup_with(
        Harness.with_engine(Executor(FakePrimitives(dataclasses.replace(CFG, truncate_partial=False)))), ID, DIGEST, 0
    ),
    "unknown strategy kind": lambda: setup()[0].engine.register_strategy("medusa", ID, DIGEST),
    "ring capacity 0": lambda: ExecutorConfig(ring_capacity=0),
    "ring capacity a float": lambda: ExecutorConfig(ring_capacity=64.0),
    "prefill rows 0": lambda: ExecutorConfig(max_prefill_rows=0),
    "fake vocabulary too small": lambda: FakePrimitives(FakeConfig(vocab=2, eos=1)),
    "fake favour logit NaN": lambda: FakePrimitives(FakeConfig(favour_logit=math.nan)),
    "read tokens of no ring": lambda: setup()[0].engine.read_tokens(TokenRef(99, 0, 1)),
    "read tokens past what was written": lambda: setup()[0].engine.read_tokens(TokenRef(0, 0, 1000)),
    "drop an unknown prompt": lambda: setup()[0].engine.drop_prompt(999),
    "drop prompt id a bool": lambda: setup()[0].engine.drop_prompt(True),
    "tokens of an unknown lane": lambda: setup()[0].engine.lane_tokens(3),
    "generator tick tokens 0": lambda: Generator(FakePrimitives(CFG), tick_tokens=0),
    "generator speculation the backend cannot verify": lambda: run_request(FakeConfig(copy_model=True)),
    "generator request top_k past the limit": lambda: run_request(sampling=Sampling.GPU_GUMBEL, params=SamplingParams(top_k=17)),
    "strategy config of the wrong type": lambda: setup()[0].engine.register_strategy("prompt_lookup", ID, DIGEST, 0, {"max_draft": 4}),
    "draft n-gram sizes out of order": lambda: PromptLookupConfig(ngram_min=3, ngram_max=2),
    "draft length 0": lambda: PromptLookupConfig(max_draft=0),
    "truncate to a prefix without partial rollback": lambda: partial_rollback_refused(),
    "logits at every row without verify rows": lambda: FakePrimitives(dataclasses.replace(CFG, verify_rows=False)).forward(
        rows([0, 0], [0, 1], [1, 2], [0, 1])
    ),
    "fault at an unknown op": lambda: Fault("forward", 1),
    "fault poisoning logits a call does not return": lambda: Fault("prefill", 1, "nan"),
}


@pytest.mark.parametrize("case", list(OTHERS))
def test_other_refusals_raise_a_status_error(case):
    with pytest.raises(StatusError):
        OTHERS[case]()


# -- the primitives' seam ------------------------------------------------------------


def rows(lanes, positions, tokens, logit_rows=()):
    a = lambda v: np.asarray(v, np.int64)  # noqa: E731
    return Rows(a(lanes), a(positions), a(tokens), a(logit_rows))


def sample_rows(**one_row) -> SampleRows:
    """One row of sampling inputs: greedy, no draft, fields overridden by ``one_row``."""
    row = {**dict(mode=0, temperature=1.0, top_p=1.0, top_k=0, rng_key=0, position=1, draft=-1), **one_row}
    return SampleRows(**{k: np.asarray([v], np.float32 if k in ("temperature", "top_p") else np.int64) for k, v in row.items()})


SEAM = {
    "forward row not at the state length": (lambda f: f.forward(rows([0], [1], [5])), Status.BAD_ARGUMENT, "expected 0"),
    "forward token past the vocabulary": (lambda f: f.forward(rows([0], [0], [64])), Status.TOKEN_OUT_OF_VOCAB, "outside 0..63"),
    "forward slot past max_lanes": (lambda f: f.forward(rows([5], [0], [1])), Status.BAD_ARGUMENT, "slot outside"),
    "forward position past the context": (lambda f: f.forward(rows([0], [32], [1])), Status.CAPACITY_EXHAUSTED, "position outside"),
    "forward arrays of different lengths": (lambda f: f.forward(rows([0, 0], [0, 1], [1])), Status.BAD_ARGUMENT, "differ in length"),
    "forward logit row past the rows": (lambda f: f.forward(rows([0], [0], [1], [1])), Status.BAD_ARGUMENT, "logit_rows"),
    "forward float arrays": (
        lambda f: f.forward(Rows(np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(0))), Status.BAD_ARGUMENT, "integer",
    ),
    "truncate past the state": (lambda f: f.truncate(0, 3), Status.BAD_ARGUMENT, "outside 0..0"),
    "verify_sample rng key negative": (
        lambda f: f.verify_sample(np.zeros((1, 64), np.float32), sample_rows(rng_key=-1)), Status.BAD_ARGUMENT, "rng_key",
    ),
    "verify_sample unknown mode": (
        lambda f: f.verify_sample(np.zeros((1, 64), np.float32), sample_rows(mode=7)), Status.BAD_SAMPLING_MODE, "unknown sampling mode",
    ),
    "verify_sample logits of the wrong shape": (
        lambda f: f.verify_sample(np.zeros((2, 64), np.float32), SampleRows.empty()), Status.BAD_ARGUMENT, "logits shape",
    ),
}


@pytest.mark.parametrize("case", list(SEAM))
def test_the_primitives_check_every_call_once(case):
    call, status, words = SEAM[case]
    f = FakePrimitives(CFG)
    with pytest.raises(StatusError) as err:
        call(f)
    assert err.value.status == status and words in str(err.value), str(err.value)
    assert all(f.state_len(s) == 0 for s in range(CFG.max_lanes)), "a refused call changes nothing"


def partial_rollback_refused():
    f = FakePrimitives(dataclasses.replace(CFG, truncate_partial=False))
    f.forward(rows([0, 0, 0], [0, 1, 2], [1, 2, 3]))
    f.truncate(0, 1)


def test_a_backend_without_partial_rollback_refuses_one():
    f = FakePrimitives(dataclasses.replace(CFG, truncate_partial=False))
    f.forward(rows([0, 0, 0], [0, 1, 2], [1, 2, 3]))
    with pytest.raises(StatusError) as err:
        f.truncate(0, 1)
    assert err.value.status == Status.UNSUPPORTED
    assert f.state_len(0) == 3
    f.truncate(0, 0)


def test_a_backend_without_verify_rows_gives_logits_only_at_each_lanes_last_row():
    f = FakePrimitives(dataclasses.replace(CFG, verify_rows=False))
    with pytest.raises(StatusError) as err:
        f.forward(rows([0, 0], [0, 1], [1, 2], [0, 1]))
    assert err.value.status == Status.UNSUPPORTED
    assert f.forward(rows([0, 0], [0, 1], [1, 2], [1])).shape == (1, 64)


# -- docs/errors.md: every refusal above, with its Status and its exact message -----------------


def _error_of(case: str) -> StatusError:
    """Run the refusal named ``case``; the StatusError it raised."""
    if case in CASES:
        h, p, slot = setup()
        h.tick_err(CASES[case][0](h, p, slot))
        return h.last_error
    if case in PROMPTS:
        call = lambda: setup()[0].prompt(PROMPTS[case][0])  # noqa: E731
    elif case in SAMPLING:
        call = lambda: SamplingParams(**SAMPLING[case][0])  # noqa: E731
    elif case in SEAM:
        call = lambda: SEAM[case][0](FakePrimitives(CFG))  # noqa: E731
    else:
        call = OTHERS[case]
    with pytest.raises(StatusError) as err:
        call()
    return err.value


ERRORS_MD = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def documented_refusals() -> dict[str, tuple[str, str]]:
    """The rows of the Python API table in docs/errors.md: case -> (Status name, message)."""
    text = ERRORS_MD.read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.fullmatch(r"\| (.+?) \| (.+?) \| `(\w+)` \| `(.*)` \|", line)
        if m:
            case, _sent, status, message = m.groups()
            assert case not in rows, f"docs/errors.md lists {case!r} twice"
            rows[case] = (status, message.replace("\\|", "|"))
    return rows


def test_docs_errors_lists_every_refusal_the_tests_make():
    documented = set(documented_refusals())
    tested = set(CASES) | set(PROMPTS) | set(SAMPLING) | set(SEAM) | set(OTHERS)
    assert not tested - documented, f"refusals missing from docs/errors.md: {sorted(tested - documented)}"
    assert not documented - tested, f"docs/errors.md rows no test makes: {sorted(documented - tested)}"


@pytest.mark.parametrize("case", sorted(documented_refusals()))
def test_docs_errors_gives_the_status_and_message_the_refusal_has(case):
    status, message = documented_refusals()[case]
    err = _error_of(case)
    assert (err.status.name, str(err)) == (status, message)

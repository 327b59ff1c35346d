"""Grammar-constrained lanes (sf_trt.grammar): valid output, exact under speculation.

* every output of a constrained lane parses and validates against its schema (``jsonschema``)
  or matches its regex / choice, and ends with EOS where the grammar accepts;
* a speculating lane emits what the plain lane emits, greedy and sampled, alone and among
  16 lanes (constrained, penalised and plain ones sharing passes);
* a draft token the grammar forbids is cut before the pass (counted), so drafts still run;
* the mask changes the output (an unconstrained run is not valid JSON): the tests are not vacuous;
* a constraint the engine cannot compile is a GrammarError naming it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import jsonschema
import numpy as np
import pytest
from lanes import LaneSpec, plain_alone, run_lanes

from sf_trt.abi import Finish, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.executor import Executor
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.grammar import GrammarError, LaneGrammar, compile_grammar, token_table
from sf_trt.testing import Harness
from sf_trt.tokenizer import ByteTokenizer

VOCAB, EOS = 257, 256
TOK = ByteTokenizer(VOCAB, EOS)
SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 999},
        "name": {"type": "string", "maxLength": 8},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["n", "name", "colour", "tags"],
    "additionalProperties": False,
}
PROMPT = tuple(b'{"n":12,"name":"ab","colour":"red","tags":["x"]} {"n":12,"name":"ab","colour":"red","tags":["x"]} {"n":1')


@functools.lru_cache(maxsize=1)
def table():
    return token_table(TOK, VOCAB, EOS)


def grammar(kind: str = "json_schema", source=SCHEMA):
    return compile_grammar(kind, source, table())


def fake(max_lanes: int = 16, miss_every: int = 6):
    cfg = FakeConfig(vocab=VOCAB, eos=EOS, copy_model=True, copy_miss_every=miss_every, verify_rows=True,
                     max_lanes=max_lanes, max_context=512, max_rows_per_pass=512, top_k_limit=64)
    return functools.partial(FakePrimitives, cfg)


def text_of(tokens: list[int]) -> str:
    assert tokens and tokens[-1] == EOS, "a constrained lane ends with EOS where its grammar accepts"
    return bytes(tokens[:-1]).decode()


def spec(mode: Sampling, seed: int, g, *, budgets=(7, 50, 200), prompt=PROMPT, **params) -> LaneSpec:
    params = {"temperature": 0.9, "max_tokens": 300, **params}
    return LaneSpec(prompt=prompt, mode=mode, params=SamplingParams(grammar=g, **params),
                    speculate=True, seed=seed, budgets=budgets)


@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_speculating_constrained_lane_emits_the_plain_lanes_valid_json(mode, seed):
    s = spec(mode, seed, grammar())
    (run,) = run_lanes(fake(), [s])
    plain = plain_alone(fake(), s)
    assert (run.tokens, run.finish) == (plain.tokens, plain.finish)
    assert run.finish == Finish.EOS
    jsonschema.validate(json.loads(text_of(run.tokens)), SCHEMA)
    assert run.proposed > 0, "drafts ran: the test exercises speculation"


def test_without_the_grammar_the_same_lane_is_not_valid_json():
    s = spec(Sampling.GPU_GUMBEL, 0, None, budgets=(60,), max_tokens=60)
    (run,) = run_lanes(fake(), [s])
    text = bytes(t for t in run.tokens if t != EOS).decode(errors="replace")
    with pytest.raises((ValueError, jsonschema.ValidationError)):
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("kind, source, check", [
    ("regex", r"[a-c]{2,5}-[0-9]{3}", lambda t: re.fullmatch(r"[a-c]{2,5}-[0-9]{3}", t)),
    ("choice", ["maybe", "yes", "no"], lambda t: t in ("maybe", "yes", "no")),
    ("json_object", None, lambda t: isinstance(json.loads(t), dict)),
    ("lark", 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,2}/', lambda t: re.fullmatch(r"\(\d{1,2}(,\d{1,2})*\)", t)),
])
@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
def test_regex_choice_object_and_lark_outputs_match_and_speculation_keeps_them(kind, source, check, mode):
    prompt = tuple(b"ab-123 (1,2) yes {} abc-999 (12,3) no {} ab-12")
    s = spec(mode, 4, grammar(kind, source), prompt=prompt)
    (run,) = run_lanes(fake(), [s])
    assert (run.tokens, run.finish) == (plain_alone(fake(), s).tokens, plain_alone(fake(), s).finish)
    assert check(text_of(run.tokens)), text_of(run.tokens)


def test_sixteen_lanes_constrained_penalised_and_plain_each_emit_what_they_emit_alone():
    g, rx = grammar(), grammar("regex", r"[a-z]{1,6}(,[a-z]{1,6}){0,5}")
    specs = []
    for i in range(16):
        mode = (Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL)[i % 2]
        kind = i % 4
        params = dict(grammar=(g, rx, None, g)[kind])
        if kind == 3:
            params.update(presence_penalty=0.5, logit_bias=((ord("z"), 2.0),))
        s = spec(mode, 100 + i, None, budgets=(5, 9, 300))
        s = dataclasses.replace(s, admit_tick=i % 3, params=dataclasses.replace(s.params, **params),
                                prompt=PROMPT if kind != 1 else tuple(b"abc,de,fgh abc,de,f"))
        specs.append(s)
    together = run_lanes(fake(), specs)
    for i, (s, run) in enumerate(zip(specs, together)):
        alone = plain_alone(fake(), s)
        assert (run.tokens, run.finish) == (alone.tokens, alone.finish), f"lane {i}"
        if s.params.grammar is g:
            jsonschema.validate(json.loads(text_of(run.tokens)), SCHEMA)


def test_a_draft_token_the_grammar_forbids_is_cut_before_the_pass_and_counted():
    """The prompt repeats an invalid continuation (``"n":12x``): prompt lookup drafts it, the
    grammar cuts the draft at ``x``, and the output is still the plain lane's."""
    prompt = tuple(b'{"n":12x,"q":1} {"n":12x,"q":1} {"n":1')
    s = spec(Sampling.GPU_GREEDY, 0, grammar(), prompt=prompt)
    h = Harness.with_engine(Executor(fake()()))
    (run,) = run_lanes(fake(), [s], harness=h)
    assert h.engine.grammar_cut_tokens > 0
    assert run.tokens == plain_alone(fake(), s).tokens
    jsonschema.validate(json.loads(text_of(run.tokens)), SCHEMA)


def test_lane_grammar_rows_are_the_masks_after_each_draft_prefix_and_leave_the_state():
    lane = LaneGrammar(grammar())
    lane.extend(list(b'{"n":1'))
    draft = list(b'2,"name"')
    allowed = lane.allowed(draft)
    assert allowed.shape == (len(draft) + 1, VOCAB)
    for i in range(len(draft) + 1):
        probe = LaneGrammar(grammar())
        probe.extend(list(b'{"n":1') + draft[:i])
        np.testing.assert_array_equal(allowed[i], probe.allowed([])[0], err_msg=f"row {i}")
    assert not allowed[0][EOS] and allowed[0][ord("2")] and not allowed[0][ord("x")]
    np.testing.assert_array_equal(lane.allowed([])[0], allowed[0])  # the matcher is back where it began
    assert lane.valid_prefix(list(b"2x3")) == 1 and lane.cut_tokens == 2


@pytest.mark.parametrize("kind, source, words", [
    ("json_schema", {"type": "object", "properties": {"a": {"type": "wat"}}}, "json_schema"),
    ("json_schema", "[1, 2]", "must be a JSON object"),
    ("regex", "a(b", "regex"),
    ("choice", [], "non-empty list"),
    ("lark", "start: undefined_rule", "lark"),
    ("xml", "", "unknown grammar kind"),
])
def test_a_constraint_the_engine_cannot_compile_is_a_grammar_error_naming_it(kind, source, words):
    with pytest.raises(GrammarError, match=words):
        grammar(kind, source)


def test_a_grammar_refuses_ignore_eos_min_tokens_and_a_model_of_another_vocabulary():
    with pytest.raises(StatusError, match="IGNORE_EOS") as exc:
        SamplingParams(grammar=grammar(), flags=SamplingFlag.IGNORE_EOS)
    assert exc.value.status == Status.BAD_SAMPLING_PARAMS
    with pytest.raises(StatusError, match="min_tokens"):
        SamplingParams(grammar=grammar(), min_tokens=3)
    assert "vocabulary of 257" in SamplingParams(grammar=grammar()).check_for(Sampling.GPU_GREEDY, top_k_limit=64, vocab=300)

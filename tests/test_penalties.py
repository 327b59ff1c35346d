"""Penalties, logit bias and min_tokens: vLLM's formula, exact under speculation.

* the adjust graph's rows against a numpy statement of vLLM's ``apply_penalties`` (and
  its logit-bias and min-tokens processors), bit for bit, over the dense vocabulary;
* the executor feeds each verify row the counts of the prefix before it, draft included:
  speculating lanes emit what plain lanes emit, alone and many together, greedy and
  sampled, with EOS inside drafts, budgets and max_tokens;
* the adjustments change the output (the tests are not vacuous), and a lane without
  them never runs the adjust graph;
* bad values are refused at the seam with BAD_SAMPLING_PARAMS naming the field.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import LaneSpec, plain_alone, run_lanes

from sf_trt.abi import Finish, Sampling, SamplingFlag, SamplingParams, Status, StatusError
from sf_trt.backends.ort_adjust import OrtLogitAdjust
from sf_trt.executor import Executor
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.penalties import LanePenalties, pack
from sf_trt.testing import Harness

VOCAB = 24
EOS = 23
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def vllm_reference(logits: np.ndarray, prompt: list[int], output: list[int], p: SamplingParams, eos: int) -> np.ndarray:
    """vLLM's sampler front in float32 over the whole vocabulary: min-tokens, logit bias,
    then ``apply_penalties`` (repetition on prompt | output, frequency and presence on the
    output's bin counts), as its v1 Sampler orders them."""
    x = np.array(logits, np.float32)
    v = x.shape[0]
    if len(output) < p.min_tokens:
        stops = set(p.stop_token_ids) | (set() if p.flags & SamplingFlag.IGNORE_EOS else {eos})
        x[sorted(stops)] = -np.inf
    for token, bias in p.logit_bias:
        x[token] += np.float32(bias)
    counts = np.bincount(np.asarray(output, np.int64), minlength=v)[:v]
    seen = (np.bincount(np.asarray(prompt, np.int64), minlength=v)[:v] > 0) | (counts > 0)
    r = np.where(seen, np.float32(p.repetition_penalty), np.float32(1.0)).astype(np.float32)
    x = np.where(x > 0, x / r, x * r).astype(np.float32)
    x = (x - np.float32(p.frequency_penalty) * counts.astype(np.float32)).astype(np.float32)
    x = (x - np.float32(p.presence_penalty) * (counts > 0).astype(np.float32)).astype(np.float32)
    return x


penalty_params = st.builds(
    SamplingParams,
    presence_penalty=st.sampled_from([0.0, 0.5, -0.7, 2.0]),
    frequency_penalty=st.sampled_from([0.0, 0.3, -0.4, 1.5]),
    repetition_penalty=st.sampled_from([1.0, 1.3, 0.8, 2.0]),
    logit_bias=st.dictionaries(st.integers(0, VOCAB - 1), st.sampled_from([-100.0, -3.0, 0.5, 4.0, 100.0]), max_size=3),
    min_tokens=st.sampled_from([0, 0, 2, 6]),
    stop_token_ids=st.lists(st.integers(0, VOCAB - 1), max_size=2).map(tuple),
    flags=st.sampled_from([SamplingFlag(0), SamplingFlag.IGNORE_EOS]),
)


@SETTINGS
@given(p=penalty_params, prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
       output=st.lists(st.integers(0, VOCAB - 1), max_size=20), draft=st.lists(st.integers(0, VOCAB - 1), max_size=6),
       seed=st.integers(0, 2**32 - 1))
def test_each_row_is_vllms_formula_over_the_prefix_before_it(p, prompt, output, draft, seed):
    """Row i of a step adjusts exactly as vLLM adjusts the row after prompt + output + draft[:i]."""
    books = LanePenalties(p, prompt, EOS)
    books.extend(output)
    step = books.rows(draft)
    n = len(draft) + 1
    logits = np.random.default_rng(seed).normal(0, 4, size=(n, VOCAB)).astype(np.float32)
    adjust = pack([(0, step)])
    got = OrtLogitAdjust(VOCAB).run(logits, adjust)
    for i in range(n):
        want = vllm_reference(logits[i], prompt, output + draft[:i], p, EOS)
        np.testing.assert_array_equal(got[i], want, err_msg=f"row {i}")


def fake(miss_every: int = 0, max_lanes: int = 12, favour_logit=None):
    cfg = FakeConfig(vocab=VOCAB, eos=EOS, copy_model=True, copy_miss_every=miss_every, verify_rows=True,
                     max_lanes=max_lanes, max_context=256, max_rows_per_pass=160, top_k_limit=16, favour_logit=favour_logit)
    return functools.partial(FakePrimitives, cfg)


prompts = st.lists(st.integers(0, 8), min_size=1, max_size=30).map(tuple)
eos_prompts = st.lists(st.sampled_from([1, 2, 3, EOS]), min_size=2, max_size=30).map(tuple)


@st.composite
def lane_specs(draw, prompt_strategy=prompts):
    p = draw(penalty_params)
    mode = draw(st.sampled_from([Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL]))
    p = dataclasses.replace(p, temperature=draw(st.sampled_from([0.5, 1.0])), top_p=draw(st.sampled_from([1.0, 0.9])),
                            max_tokens=draw(st.sampled_from([0, 8, 30])))
    return LaneSpec(prompt=draw(prompt_strategy), mode=mode, params=p, speculate=True, seed=draw(st.integers(0, 2**63 - 1)),
                    admit_tick=draw(st.integers(0, 2)), prefill_chunk=draw(st.integers(1, 16)),
                    budgets=tuple(draw(st.lists(st.integers(1, 12), min_size=1, max_size=4))))


@SETTINGS
@given(spec=lane_specs(), miss_every=st.sampled_from([0, 0, 3]))
def test_a_speculating_lane_with_penalties_emits_what_the_plain_lane_emits(spec, miss_every):
    make = fake(miss_every)
    (spec_run,) = run_lanes(make, [spec])
    plain = plain_alone(make, spec)
    assert (spec_run.tokens, spec_run.finish) == (plain.tokens, plain.finish)


@SETTINGS
@given(spec=lane_specs(eos_prompts))
def test_eos_inside_drafts_and_min_tokens_end_the_lane_where_plain_does(spec):
    spec = dataclasses.replace(spec, params=dataclasses.replace(spec.params, flags=SamplingFlag(0)))
    (spec_run,) = run_lanes(fake(), [spec])
    plain = plain_alone(fake(), spec)
    assert (spec_run.tokens, spec_run.finish) == (plain.tokens, plain.finish)
    if plain.finish == Finish.EOS:
        assert len(plain.tokens) > spec.params.min_tokens or spec.params.min_tokens == 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(lane_specs(), min_size=8, max_size=10), plain_share=st.lists(st.booleans(), min_size=10, max_size=10))
def test_many_lanes_with_and_without_penalties_each_emit_what_they_emit_alone(specs, plain_share):
    """8+ lanes sharing passes; some without adjustments, so a pass mixes adjusted rows and raw ones."""
    specs = [dataclasses.replace(s, params=SamplingParams(temperature=s.params.temperature, max_tokens=s.params.max_tokens)) if off else s
             for s, off in zip(specs, plain_share)]
    make = fake(3)
    together = run_lanes(make, specs)
    for s, run in zip(specs, together):
        alone = plain_alone(make, s)
        assert (run.tokens, run.finish) == (alone.tokens, alone.finish)


def _decode(params: SamplingParams, mode: Sampling, prompt, n: int = 40, speculate: bool = False) -> list[int]:
    spec = LaneSpec(prompt=tuple(prompt), mode=mode, params=params, speculate=speculate, seed=5, budgets=(n,))
    (run,) = run_lanes(fake(favour_logit=1.5), [spec])
    return run.tokens


@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
@pytest.mark.parametrize("change", [
    {"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"repetition_penalty": 2.0},
    {"logit_bias": {4: 100.0}}, {"min_tokens": 30, "stop_token_ids": (1,)},
])
def test_each_adjustment_changes_the_output_and_speculation_keeps_it(mode, change):
    """The fake favours the copied token by 1.5 over the rest (0), and token 5 gets a bias of 1:
    each adjustment is strong enough to move the greedy token too."""
    prompt = [1, 2, 3, 1, 2, 3, EOS, 1, 2, 3, 1, 2]
    base = SamplingParams(temperature=0.7, max_tokens=40, logit_bias={5: 1.0}, flags=SamplingFlag.IGNORE_EOS)
    plain = _decode(base, mode, prompt)
    adjusted = dataclasses.replace(base, **change)
    got = _decode(adjusted, mode, prompt)
    assert got != plain, "the adjustment changed nothing: the test would be vacuous"
    assert _decode(adjusted, mode, prompt, speculate=True) == got
    if "min_tokens" in change:
        assert 1 not in got[:30] and 1 in plain[:30]
    if "logit_bias" in change:
        assert got.count(4) > len(got) // 2


def test_speculation_is_exercised_with_rejections_under_penalties():
    """Drafts are proposed and some rejected, so rows past a rejection were adjusted and thrown away."""
    spec = LaneSpec(prompt=(1, 2, 3, 4, 1, 2, 3, 4, 1, 2), mode=Sampling.GPU_GUMBEL, speculate=True, seed=3, budgets=(40,),
                    params=SamplingParams(temperature=0.7, frequency_penalty=0.02, presence_penalty=0.1, repetition_penalty=1.05, max_tokens=40))
    (run,) = run_lanes(fake(3), [spec])
    assert run.proposed > run.accepted > 0
    assert run.tokens == plain_alone(fake(3), spec).tokens


def test_a_batch_without_adjustments_never_builds_the_adjust_graph():
    prims = fake()()
    h = Harness.with_engine(Executor(prims))
    p = h.prompt([1, 2, 3])
    h.tick_ok(h.plan().admit(1, p, sampling=Sampling.GPU_GUMBEL, params=SamplingParams(temperature=0.8)).prefill(1, 0, 3).decode(1, 8))
    assert getattr(prims, "_adjuster", None) is None
    p2 = h.prompt([1, 2, 3])
    h.tick_ok(h.plan().admit(2, p2, params=SamplingParams(presence_penalty=0.5)).prefill(2, 0, 3).decode(2, 4))
    assert prims._adjuster is not None


@pytest.mark.parametrize("kwargs, message", [
    ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2.0, 2.0\] \(got 2.5\)"),
    ({"frequency_penalty": float("nan")}, r"frequency_penalty must be finite"),
    ({"repetition_penalty": 0.0}, r"repetition_penalty must be in \[2\*\*-16, 2\*\*16\] \(1: off\) \(got 0.0\)"),
    ({"logit_bias": {3: 101}}, r"logit_bias\[3\] must be a number in \[-100, 100\] \(got 101\)"),
    ({"logit_bias": {-1: 1.0}}, r"logit_bias keys must be token ids"),
    ({"logit_bias": "x"}, r"logit_bias must map token ids to biases \(got str\)"),
    ({"min_tokens": -1}, r"min_tokens must be >= 0 \(got -1\)"),
    ({"min_tokens": 5, "max_tokens": 3}, r"min_tokens 5 exceeds max_tokens 3"),
    ({"stop_token_ids": [1.5]}, r"stop_token_ids must hold token ids"),
])
def test_bad_adjustments_are_refused_naming_the_field(kwargs, message):
    with pytest.raises(StatusError, match=message) as e:
        SamplingParams(**kwargs)
    assert e.value.status == Status.BAD_SAMPLING_PARAMS


def test_a_bias_outside_the_vocabulary_is_refused_at_admission_and_changes_nothing():
    h = Harness.with_engine(Executor(fake()()))
    p = h.prompt([1, 2, 3])
    h.tick_ok(h.plan().admit(1, p).prefill(1, 0, 3).decode(1, 2))
    before = h.engine.snapshot()
    for params, what in ((SamplingParams(logit_bias={VOCAB: 1.0}), "logit_bias"), (SamplingParams(min_tokens=2, stop_token_ids=(99,)), "stop_token_ids")):
        status = h.tick_err(h.plan().admit(2, p, params=params).decode(1, 2))
        assert status == Status.BAD_SAMPLING_PARAMS
        with pytest.raises(StatusError, match=rf"admit\(lane=2\): {what}: token ids \[\d+\] outside the vocabulary 0..{VOCAB - 1}"):
            h.engine.tick(h.plan().admit(2, p, params=params))
        assert h.engine.snapshot() == before


def test_a_requests_stop_ids_are_held_back_until_min_tokens_and_stop_it_after():
    from sf_trt.generate import Generator
    from sf_trt.scheduler import Request

    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    gen = Generator(fake(favour_logit=1.5)())
    base = SamplingParams(max_tokens=30, flags=SamplingFlag.IGNORE_EOS)
    early, held = gen.run([
        Request(prompt, params=base, stop_token_ids=(1,), speculate=False),
        Request(prompt, params=dataclasses.replace(base, min_tokens=12), stop_token_ids=(1,)),
    ])
    assert early.finish == Finish.STOP and len(early.tokens) < 12
    assert 1 not in held.tokens[:12] and len(held.tokens) >= 12  # vLLM: no stop among the first min_tokens tokens
    assert held.finish == Finish.STOP and held.tokens[-1] == 1 or held.finish == Finish.LENGTH
    assert Request(prompt, params=dataclasses.replace(base, min_tokens=2), stop_token_ids=(1, 7)).params.stop_token_ids == (1, 7)


def test_the_adjust_graph_checks_and_uses_only_the_ops_its_ops_md_section_lists():
    import re
    from pathlib import Path

    import onnx

    from sf_trt.export.trt_support import check_graph, errors_in
    from sf_trt.graphs.adjust import build_adjust_graph

    section = (Path(__file__).resolve().parents[1] / "export" / "OPS.md").read_text().split("\n## adjust", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([A-Za-z]+)` \|", section, flags=re.M))
    for vocab in (24, 49152):
        model = build_adjust_graph(vocab)
        onnx.checker.check_model(model, full_check=True)
        assert {n.op_type for n in model.graph.node} == listed
        assert errors_in(check_graph(model)) == []


@pytest.mark.parametrize("kind, finish", [("nan", Finish.ERROR), ("posinf", Finish.ERROR), ("neginf", Finish.ERROR), ("raise", Finish.ERROR)])
def test_a_fault_in_a_penalized_lanes_pass_ends_it_alone_with_the_tokens_before(kind, finish):
    """Row faults are read from the adjusted rows; a penalized lane's fault ends that lane
    (its tokens so far emitted), and a lane beside it decodes on as it does alone."""
    from sf_trt.faults import Fault, FaultyPrimitives

    params = SamplingParams(temperature=0.8, presence_penalty=0.5, repetition_penalty=1.3, logit_bias={4: 2.0}, max_tokens=12)
    prims = FaultyPrimitives(fake()(), [Fault("decode", 4, kind, rows=(0,))])
    h = Harness.with_engine(Executor(prims))
    p1, p2 = h.prompt([1, 2, 3, 1, 2]), h.prompt([5, 6, 7])
    plan = h.plan().admit(1, p1, sampling=Sampling.GPU_GUMBEL, params=params, rng_counter_base=3).prefill(1, 0, 5)
    plan.admit(2, p2, params=SamplingParams(frequency_penalty=0.4, max_tokens=12)).prefill(2, 0, 3)
    tokens = {1: [], 2: []}
    ends = {}
    for _ in range(12):
        live = [lane for lane in (1, 2) if lane not in ends]
        if not live:
            break
        for lane in live:
            plan.decode(lane, 1)
        ev = h.tick_ok(plan)
        for lane in live:
            e = ev.emit_for(lane)
            tokens[lane] += h.rings_tokens(e.token_ref)
            if e.finish != Finish.NONE:
                ends[lane] = e.finish
        plan = h.plan()
    assert ends[1] == finish and len(tokens[1]) == 3  # decode passes 1-3 drew its tokens, the 4th failed
    if kind == "raise":
        assert ends[2] == Finish.ERROR  # a raising pass ends every lane in it
    else:
        spec = LaneSpec(prompt=(5, 6, 7), params=SamplingParams(frequency_penalty=0.4, max_tokens=12), budgets=(12,))
        assert (tokens[2], ends[2]) == (run_lanes(fake(), [spec])[0].tokens, Finish.LENGTH)

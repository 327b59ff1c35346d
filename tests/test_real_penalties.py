"""Penalties, logit bias, min_tokens and prompt logprobs on the real SmolLM2 model.

Speculative == plain token for token under every adjustment, greedy and sampled, with
lanes sharing passes; the adjustments change the output; an lm-eval-style
loglikelihood from prompt logprobs equals the decode path's logprobs of the same tokens
bit for bit, and a direct log-softmax of the model's logits.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sf_trt.abi import Finish, Sampling, SamplingParams
from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.generate import Generator
from sf_trt.scheduler import DraftPolicy, Request
from rows import direct_logprobs
from test_real_speculation import CODE

pytestmark = pytest.mark.slow

PROMPTS = [
    f"Rename the variable result to subtotal and return the whole function.\n\n{CODE}",
    "Write one sentence about the sea.",
    "List three colours.",
]
ADJUSTMENTS = {
    "presence, frequency, bias": dict(presence_penalty=0.6, frequency_penalty=0.4, logit_bias={28: 5.0, 30: -100.0}),
    "repetition, min_tokens": dict(repetition_penalty=1.3, min_tokens=24),
}


@pytest.fixture(scope="module")
def prims(real_model_dir):
    with OrtDecoderPrimitives(real_model_dir, max_lanes=3, max_context=256, threads=2) as p:
        yield p


@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
@pytest.mark.parametrize("name", list(ADJUSTMENTS))
def test_speculative_lanes_with_adjustments_emit_exactly_the_plain_tokens(prims, real_tokenizer, mode, name):
    tok = real_tokenizer
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
    base = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=32)
    params = dataclasses.replace(base, **ADJUSTMENTS[name])
    gen = Generator(prims, policy=DraftPolicy())  # drafts in every pass
    unadjusted = [gen.run([Request(i, mode, base, seed=7, speculate=False)])[0] for i in ids]
    plain = [gen.run([Request(i, mode, params, seed=7, speculate=False)])[0] for i in ids]  # one lane at a time
    spec = gen.run([Request(i, mode, params, seed=7) for i in ids])  # three lanes sharing passes
    for p, s in zip(plain, spec):
        assert (s.tokens, s.finish) == (p.tokens, p.finish)
        assert p.finish in (Finish.EOS, Finish.LENGTH)
    assert sum(s.proposed for s in spec) > 0 and sum(s.proposed - s.accepted for s in spec) > 0, "drafts proposed and some rejected"
    assert [p.tokens for p in plain] != [u.tokens for u in unadjusted], "the adjustments changed nothing"
    if "min_tokens" in name:
        assert all(len(p.tokens) >= 24 for p in plain)


def test_loglikelihood_from_prompt_logprobs_equals_the_decode_paths_and_a_direct_computation(prims, real_tokenizer):
    tok = real_tokenizer
    context = tok.encode("The capital of France is")
    gen = Generator(prims, prefill_chunk=5)  # the scoring prefill runs in chunks of 5
    (decoded,) = gen.run([Request(context, params=SamplingParams(max_tokens=6), logprobs=0, speculate=False)])
    continuation = decoded.tokens
    (scored,) = gen.run([Request(context + continuation, prompt_logprobs=0, prompt_only=True)])
    assert scored.tokens == [] and len(scored.prompt_logprobs) == len(context) + len(continuation) - 1
    cont_lp = scored.prompt_logprobs.logprob[len(context) - 1 :]
    np.testing.assert_array_equal(cont_lp, decoded.logprobs.logprob)  # the same rows, bit for bit
    direct = direct_logprobs(prims, context + continuation)  # one pass over the whole sequence, log-softmax in float64
    assert abs(float(cont_lp.sum()) - float(direct[len(context) - 1 :].sum())) < 1e-4
    np.testing.assert_allclose(scored.prompt_logprobs.logprob, direct, atol=1e-4)


@pytest.mark.parametrize("mode", [Sampling.GPU_GREEDY, Sampling.GPU_GUMBEL])
def test_eight_lanes_with_different_adjustments_each_emit_what_they_emit_alone(real_model_dir, real_tokenizer, mode):
    """Eight requests sharing passes, each with its own adjustments (and one with none), against each alone, plain."""
    tok = real_tokenizer
    texts = PROMPTS + ["Count from one to ten.", "Name a fruit.", f"Explain this code.\n\n{CODE}", "Say hello.", "Repeat: a b a b a b"]
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in texts]
    variants = [{}, *ADJUSTMENTS.values(), {"frequency_penalty": -0.5}, {"logit_bias": {tok.eos: -100.0}},
                {"presence_penalty": -1.0, "min_tokens": 10}, {"repetition_penalty": 0.9}, {"presence_penalty": 2.0}]
    reqs = [Request(i, mode, SamplingParams(temperature=0.9, max_tokens=24, **v), seed=21 + k) for k, (i, v) in enumerate(zip(ids, variants))]
    with OrtDecoderPrimitives(real_model_dir, max_lanes=8, max_context=320, threads=2) as p:
        gen = Generator(p, policy=DraftPolicy())
        together = gen.run(reqs)
        for r, t in zip(reqs, together):
            (alone,) = gen.run([dataclasses.replace(r, speculate=False)])
            assert (t.tokens, t.finish) == (alone.tokens, alone.finish)
    assert sum(t.proposed for t in together) > 0

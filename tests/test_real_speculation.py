"""Speculative == plain on the real SmolLM2 model, token for token, greedy and sampled.

Through the whole stack: tokenizer and chat template, the Generator's continuous
batching, the Executor's drafts and rollbacks, the onnxruntime decoder and the
verify-and-sample graph. Float32, int8, q4 and int4 weights; lanes sharing passes; every
drafter kind, the suffix drafter also from a corpus of the same requests.
"""

from __future__ import annotations

import pytest

from sf_trt.abi import Finish, Sampling, SamplingFlag, SamplingParams
from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
from sf_trt.generate import Generator
from sf_trt.scheduler import DraftPolicy, Request

pytestmark = pytest.mark.slow

CODE = '''def total(items):
    result = 0
    for item in items:
        if item.price > 0:
            result += item.price * item.count
    return result
'''
PROMPTS = [
    f"Rename the variable result to subtotal and return the whole function.\n\n{CODE}",
    f"Add type hints to this function and return it.\n\n{CODE}",
    "Write one sentence about the sea.",
]
SAMPLINGS = {
    "greedy": (Sampling.GPU_GREEDY, SamplingParams(max_tokens=48)),
    "sampled": (Sampling.GPU_GUMBEL, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=48)),
    "sampled top-k, past eos": (Sampling.GPU_GUMBEL, SamplingParams(temperature=1.2, top_k=40, max_tokens=40, flags=SamplingFlag.IGNORE_EOS)),
}


@pytest.fixture(scope="module", params=["float32", "int8", "q4", "int4"])
def prims(request):
    model_dir = request.getfixturevalue(f"real_{request.param}_model_dir" if request.param != "float32" else "real_model_dir")
    with OrtDecoderPrimitives(model_dir, max_lanes=3, max_context=256, threads=2) as p:
        yield p


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_speculative_lanes_emit_exactly_the_plain_tokens(prims, sampling, real_tokenizer):
    tok = real_tokenizer
    mode, params = SAMPLINGS[sampling]
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in PROMPTS]
    gen = Generator(prims, policy=DraftPolicy())  # drafts in every pass: three lanes would shed them by default
    plain = [gen.run([Request(i, mode, params, seed=11, speculate=False)])[0] for i in ids]  # one lane at a time
    for kind in ("prompt-lookup", "suffix", "suffix"):  # the second suffix run drafts from the first's corpus
        spec = gen.run([Request(i, mode, params, seed=11, drafter=kind) for i in ids])  # three lanes sharing passes
        for p, s in zip(plain, spec):
            assert (s.tokens, s.finish) == (p.tokens, p.finish), kind
            assert p.finish in (Finish.EOS, Finish.LENGTH)
        assert sum(s.proposed for s in spec) > 0
        if sampling == "greedy":
            assert spec[0].accepted > 0, "the rename prompt copies its input: drafts are taken"
    if sampling == "greedy":  # repeated: drafted from the corpus, 16 tokens a pass (the generator's tick)
        assert sum(s.passes for s in spec) <= sum(-(-len(s.tokens) // 16) + 1 for s in spec), [s.passes for s in spec]

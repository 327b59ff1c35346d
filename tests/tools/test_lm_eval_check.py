"""tools/lm_eval_check.py: lm-eval's multiple-choice scores computed directly (no lm-eval here:
it needs torch). Over the fake backend: the task's questions, lm-eval's context/continuation
split, the continuation's summed prompt logprobs against a direct log-softmax, and the
comparison with a logged samples file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rows import direct_logprobs
from servers import FAKE as SERVED, TOK as SERVED_TOK, live_server
from sf_trt.fake import FakeConfig, FakePrimitives
from sf_trt.generate import Generator
from sf_trt.tokenizer import ByteTokenizer

TOK = ByteTokenizer(257, 256)
FAKE = FakeConfig(vocab=257, eos=256, copy_model=True, copy_miss_every=6, verify_rows=True, max_lanes=4, max_context=256, top_k_limit=16)


def test_the_local_task_reads_as_lm_eval_renders_it(load_tool):
    tool = load_tool("lm_eval_check")
    qs = tool.load_task(tool.ROOT / "tools/lm_eval/capitals.yaml")
    assert len(qs) == 10 and all(len(q.continuations) == 4 and 0 <= q.answer < 4 for q in qs)
    assert qs[0] == tool.Question("Question: What is the capital of France?\nAnswer:", (" Paris", " London", " Rome", " Berlin"), 0)


def test_a_trailing_space_moves_to_the_continuation_as_in_lm_eval(load_tool):
    tool = load_tool("lm_eval_check")
    assert tool.encode_pair(TOK, "Answer: ", "Paris") == (TOK.encode("Answer:"), TOK.encode(" Paris"))
    assert tool.encode_pair(TOK, "Answer:", " Paris") == (TOK.encode("Answer:"), TOK.encode(" Paris"))


def test_loglikelihoods_are_the_continuations_direct_logprobs_and_the_pick_their_argmax(load_tool, tmp_path):
    tool = load_tool("lm_eval_check")
    qs = tool.load_task(tool.ROOT / "tools/lm_eval/capitals.yaml")[:3]
    gen = Generator(FakePrimitives(FAKE), tokenizer=TOK)
    lls = tool.loglikelihoods(gen, TOK, qs)
    ref = FakePrimitives(FAKE)
    for q, per in zip(qs, lls):
        for cont, got in zip(q.continuations, per):
            ctx, ids = tool.encode_pair(TOK, q.context, cont)
            assert len(got) == len(ids)
            np.testing.assert_allclose(got, direct_logprobs(ref, ctx + ids)[len(ctx) - 1:], atol=1e-5)
    rows = tool.score(qs, lls)
    assert [r["pick"] for r in rows] == [int(np.argmax([sum(t) for t in per])) for per in lls]
    assert [r["acc"] for r in rows] == [float(r["pick"] == q.answer) for r, q in zip(rows, qs)]

    # lm-eval's samples file: the same values agree exactly; a changed one is found
    samples = tool.as_samples(rows)
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in samples))
    c = tool.compare(rows, tool.read_samples(path))
    assert c["max_abs_delta"] == 0.0 and c["differ"] == [] and c["acc_direct"] == c["acc_lm_eval"]
    other = (rows[1]["pick"] + 1) % 4
    samples[1]["filtered_resps"][other][0] = 0.5  # now the likeliest choice
    samples[1]["acc"] = float(other == qs[1].answer)
    c = tool.compare(rows, samples)
    assert c["differ"] == [1] and c["max_abs_delta"] > 0.5


def test_the_servers_answers_to_lm_evals_own_requests_equal_the_direct_computation(load_tool):
    """lm-eval's local-completions payload (token ids, echo, logprobs 1, max_tokens 1) and its
    reading (token_logprobs[ctxlen:-1]) against sf-trt serve's app over the fake: each
    choice's loglikelihood equals the executor's prefill scoring, to the bit."""
    tool = load_tool("lm_eval_check")
    qs = tool.load_task(tool.ROOT / "tools/lm_eval/capitals.yaml")[:4]
    direct = tool.score(qs, tool.loglikelihoods(Generator(FakePrimitives(SERVED), tokenizer=SERVED_TOK), SERVED_TOK, qs))
    with live_server() as live:
        served = tool.score(qs, tool.served_loglikelihoods(live.url, "fake", SERVED_TOK, qs))
    c = tool.compare(direct, tool.as_samples(served))
    assert c == {"acc_direct": c["acc_lm_eval"], "acc_lm_eval": c["acc_lm_eval"], "max_abs_delta": 0.0, "differ": []}


@pytest.mark.slow
def test_on_the_real_model_the_task_scores_what_docs_serving_reports(load_tool, real_model_dir, real_tokenizer):
    """docs/serving.md's lm-eval table: acc 0.6 on the default model, every choice's
    loglikelihood a direct log-softmax's (float32 rows against float64: 1e-4)."""
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives

    tool = load_tool("lm_eval_check")
    qs = tool.load_task(tool.ROOT / "tools/lm_eval/capitals.yaml")
    with OrtDecoderPrimitives(real_model_dir, max_lanes=4, max_context=128) as prims:
        lls = tool.loglikelihoods(Generator(prims, tokenizer=real_tokenizer), real_tokenizer, qs)
    rows = tool.score(qs, lls)
    assert sum(r["acc"] for r in rows) == 6
    with OrtDecoderPrimitives(real_model_dir, max_lanes=1, max_context=128) as ref:
        ctx, ids = tool.encode_pair(real_tokenizer, qs[0].context, qs[0].continuations[0])
        assert abs(sum(lls[0][0]) - float(direct_logprobs(ref, ctx + ids)[len(ctx) - 1:].sum())) < 1e-4

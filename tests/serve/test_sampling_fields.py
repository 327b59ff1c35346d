"""The penalties, logit_bias, min_tokens and prompt logprobs through the official openai client.

On the fake server (byte tokens, the copy model): every new field gives the same output
with speculation on and off, and changes the output (not vacuous); ``echo`` with
``logprobs`` (and ``max_tokens: 0``) scores the prompt, the first token null, with the
decode path's very logprobs; vLLM's ``prompt_logprobs`` on both routes; bad values are
400s naming the field.
"""

from __future__ import annotations

import openai
import pytest

PROMPT = "abcabcabdabcabcab"
BASE = {"logit_bias": {str(ord("z")): 5.0}}
"""Every run biases "z" by 5, just under the fake's copied token (about 6.05): each field
below is then strong enough to change a greedy output too."""
FIELDS = {
    "presence_penalty": {"presence_penalty": 1.5},
    "frequency_penalty": {"frequency_penalty": 1.0},
    "repetition_penalty": {"extra_body": {"repetition_penalty": 1.8}},
    "logit_bias": {"logit_bias": {str(ord("z")): 8.0}},
    "min_tokens": {"extra_body": {"min_tokens": 12}, "stop": ["c"], "logit_bias": {}},
}


def _merge(kwargs: dict, speculate: str) -> dict:
    out = {**BASE, **kwargs}
    out["extra_body"] = {**kwargs.get("extra_body", {}), "sf_trt": {"speculate": speculate}}
    return out


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("name", list(FIELDS))
def test_each_field_is_exact_under_speculation_and_changes_the_output(client, name, temperature):
    common = dict(model="fake", prompt=PROMPT, max_tokens=24, temperature=temperature, seed=3, n=2)
    plain = client.completions.create(**common, **_merge(FIELDS[name], "none"))
    spec = client.completions.create(**common, **_merge(FIELDS[name], "prompt-lookup"))
    assert [c.text for c in spec.choices] == [c.text for c in plain.choices]
    rest = {k: v for k, v in FIELDS[name].items() if k != name and k != "extra_body"}  # the same run without the field
    without = client.completions.create(**common, **_merge(rest, "none"))
    assert [c.text for c in plain.choices] != [c.text for c in without.choices], "the field changed nothing"
    if name == "min_tokens":
        assert all(len(c.text) >= 11 for c in plain.choices)  # the 12th token may be the stop, cut off
        assert any(len(c.text) < 11 for c in without.choices)


def test_chat_takes_the_fields_too(client):
    msgs = [{"role": "user", "content": "abcabcabc"}]
    kw = dict(model="fake", messages=msgs, max_tokens=16, temperature=0, frequency_penalty=1.0, logit_bias={"120": 3.0})
    a = client.chat.completions.create(**kw, extra_body={"sf_trt": {"speculate": "none"}})
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_echo_with_logprobs_and_max_tokens_0_scores_the_prompt_with_the_decode_paths_logprobs(client):
    gen = client.completions.create(model="fake", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    out = gen.choices[0]
    scored = client.completions.create(model="fake", prompt=PROMPT + out.text, max_tokens=0, echo=True, logprobs=2)
    s = scored.choices[0]
    assert s.text == PROMPT + out.text and s.finish_reason == "length"
    lp = s.logprobs
    assert len(lp.tokens) == len(PROMPT) + len(out.text) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[len(PROMPT):] == out.logprobs.token_logprobs  # the same rows, bit for bit
    assert lp.text_offset == list(range(len(lp.tokens)))
    assert scored.usage.completion_tokens == 0
    # echo + logprobs while generating: the prompt's part then the output's
    both = client.completions.create(model="fake", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2, echo=True).choices[0]
    assert both.text == PROMPT + out.text
    assert both.logprobs.token_logprobs == lp.token_logprobs[: len(PROMPT)] + out.logprobs.token_logprobs


def test_streamed_echo_with_logprobs_sends_the_prompts_logprobs_first(client):
    chunks = list(client.completions.create(model="fake", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, echo=True, stream=True))
    first = chunks[0].choices[0]
    assert first.text == PROMPT and first.logprobs.token_logprobs[0] is None and len(first.logprobs.tokens) == len(PROMPT)
    whole = client.completions.create(model="fake", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, echo=True).choices[0]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.text
    streamed_lp = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert streamed_lp == whole.logprobs.token_logprobs


def test_vllms_prompt_logprobs_on_both_routes(client):
    r = client.completions.create(model="fake", prompt=PROMPT, max_tokens=2, extra_body={"prompt_logprobs": 1})
    plp = r.model_dump()["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(PROMPT)
    for j, entry in enumerate(plp[1:], start=1):
        assert str(ord(PROMPT[j])) in entry and all(v["logprob"] <= 0 for v in entry.values())
        assert 1 <= len(entry) <= 2 and sum(v["rank"] is not None for v in entry.values()) == 1  # the top one, and the token
    scored = client.completions.create(model="fake", prompt=PROMPT, max_tokens=0, echo=True, logprobs=3).choices[0]
    assert all(len(top) == 3 for top in scored.logprobs.top_logprobs[1:])
    assert [entry[str(ord(PROMPT[j]))]["logprob"] for j, entry in enumerate(plp[1:], start=1)] == scored.logprobs.token_logprobs[1:]
    c = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "abc"}], max_tokens=2, extra_body={"prompt_logprobs": 0})
    assert c.model_dump()["choices"][0]["prompt_logprobs"][0] is None


@pytest.mark.parametrize("kwargs, param", [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"logit_bias": {"9999": 1}}, None),
    ({"logit_bias": {"5": 101}}, None),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"extra_body": {"min_tokens": 9}, "max_tokens": 4}, None),
    ({"extra_body": {"stop_token_ids": [-1], "min_tokens": 2}}, None),
])
def test_bad_values_are_400s_naming_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="fake", prompt="abc", **{"max_tokens": 4, **kwargs})
    body = e.value.body
    name = param or next(iter(kwargs.get("extra_body", kwargs)))
    assert name in body["message"], body
    if param:
        assert body["param"] == param


def test_chat_refuses_max_tokens_0(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens: 0 generates nothing"):
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "abc"}], max_tokens=0)


@pytest.mark.slow
def test_on_the_real_model_lm_eval_loglikelihoods_equal_a_direct_computation(real_model_dir):
    """lm-eval's loglikelihood requests (token-id prompts, echo, logprobs, max_tokens 0) through the
    openai client: the continuation's summed logprobs equal a log-softmax of the model's logits
    over the whole sequence in one pass, and for the greedy continuation the decode path's own
    logprobs bit for bit; the multiple-choice answer is the likelier continuation."""
    from rows import direct_logprobs
    from servers import live_server
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.tokenizer import Tokenizer

    tok = Tokenizer.load(real_model_dir)
    context = tok.encode("Question: What is the capital of France?\nAnswer:")
    prims = OrtDecoderPrimitives(real_model_dir, max_lanes=2, max_context=256)
    with live_server(prims, tokenizer=tok, model_name="smollm2") as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", timeout=600, max_retries=0)
        greedy = client.completions.create(model="smollm2", prompt=context, max_tokens=5, temperature=0, logprobs=0,
                                           extra_body={"sf_trt": {"return_token_ids": True}}).choices[0]
        conts = {"Paris": tok.encode(" Paris"), "London": tok.encode(" London"), "greedy": greedy.model_dump()["token_ids"]}
        scores = {}
        for name, cont in conts.items():
            r = client.completions.create(model="smollm2", prompt=context + cont, max_tokens=0, echo=True, logprobs=0).choices[0]
            scores[name] = r.logprobs.token_logprobs[len(context):]
        assert scores["greedy"] == greedy.logprobs.token_logprobs  # the decode path's own values
    prims2 = OrtDecoderPrimitives(real_model_dir, max_lanes=1, max_context=256)
    for name, cont in conts.items():
        direct = direct_logprobs(prims2, context + cont)[len(context) - 1 :]
        assert abs(sum(scores[name]) - float(direct.sum())) < 1e-4, name
    assert sum(scores["Paris"]) > sum(scores["London"])
    prims.close()
    prims2.close()


def test_tokenize_and_detokenize_agree_with_the_completion_routes(fake_server):
    import httpx

    url = fake_server.url
    t = httpx.post(f"{url}/tokenize", json={"prompt": PROMPT}, timeout=30).json()
    assert t["tokens"] == [ord(c) for c in PROMPT] and t["count"] == len(PROMPT) and t["max_model_len"] == fake_server.state.max_context
    assert httpx.post(f"{url}/detokenize", json={"tokens": t["tokens"]}, timeout=30).json() == {"prompt": PROMPT}
    chat = httpx.post(f"{url}/tokenize", json={"messages": [{"role": "user", "content": "abc"}]}, timeout=30).json()
    assert chat["count"] == len(chat["tokens"]) > 3
    for path, body, param in (("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, "prompt"),
                              ("/tokenize", {}, "prompt"), ("/detokenize", {"tokens": [99999]}, "tokens"),
                              ("/tokenize", {"prompt": "a", "model": "other"}, "model")):
        r = httpx.post(f"{url}{path}", json=body, timeout=30)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text

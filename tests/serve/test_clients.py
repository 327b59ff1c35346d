"""Client libraries against the server, called the way their users call them: the official
``openai`` client, ``langchain-openai`` and ``litellm`` (test dependencies; none needs torch
or the network here). Each library's basic flows: chat, a stream, a batch (several prompts
or ``n`` > 1). A seeded answer through any library is the answer the openai client gets,
which test_app.py checks against the engine alone. The fake backend, no model; the real
model in one test marked slow.

docs/serving.md's client table lists what these tests cover."""

from __future__ import annotations

import os

import pytest

CHAT = [{"role": "user", "content": "the cat sat on the mat. the cat sat on the"}]
PROMPTS = ["abc abd abe abf", "the cat sat on the mat, the cat", "0101 0101 0101"]
KW = dict(max_tokens=24, temperature=0.8, seed=7)


@pytest.fixture(scope="module")
def url(fake_server) -> str:
    return f"{fake_server.url}/v1"


@pytest.fixture
def oa(client):
    return client


def chat_answer(oa, messages=CHAT, **kw) -> list[str]:
    r = oa.chat.completions.create(model="fake", messages=messages, **{**KW, **kw})
    return [c.message.content for c in sorted(r.choices, key=lambda c: c.index)]


def completion_answer(oa, prompt, **kw) -> list[str]:
    r = oa.completions.create(model="fake", prompt=prompt, **{**KW, **kw})
    return [c.text for c in sorted(r.choices, key=lambda c: c.index)]


# -- openai ------------------------------------------------------------------------------------------


def test_openai_chat_stream_n_and_a_batch_of_prompts(oa):
    (whole,) = chat_answer(oa)
    chunks = oa.chat.completions.create(model="fake", messages=CHAT, stream=True, stream_options={"include_usage": True}, **KW)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == whole
    two = chat_answer(oa, n=2)
    assert two[0] == whole and two[1] != whole
    batch = completion_answer(oa, PROMPTS)  # choice i of a batch draws with key (seed, i): the first is the prompt alone
    assert len(batch) == 3 and batch[0] == completion_answer(oa, PROMPTS[0])[0]
    streamed = {}
    for ch in oa.completions.create(model="fake", prompt=PROMPTS, stream=True, **KW):
        for c in ch.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[i] for i in range(3)] == batch
    assert oa.models.retrieve("fake").id == "fake"


# -- langchain-openai --------------------------------------------------------------------------------


@pytest.fixture
def lc():
    import langchain_openai

    return langchain_openai


def test_langchain_chat_invoke_stream_batch_and_n(lc, url, oa):
    from langchain_core.messages import HumanMessage

    llm = lc.ChatOpenAI(base_url=url, api_key="unused", model="fake", max_retries=0, timeout=30, **KW)
    (want,) = chat_answer(oa)
    assert llm.invoke(CHAT[0]["content"]).content == want
    assert "".join(chunk.content for chunk in llm.stream(CHAT[0]["content"])) == want
    texts = [f"{i}: the cat sat on the mat" for i in range(3)]
    assert [m.content for m in llm.batch(texts)] == [chat_answer(oa, [{"role": "user", "content": t}])[0] for t in texts]
    both = lc.ChatOpenAI(base_url=url, api_key="unused", model="fake", max_retries=0, n=2, **KW).generate([[HumanMessage(CHAT[0]["content"])]])
    assert [g.text for g in both.generations[0]] == chat_answer(oa, n=2)


def test_langchain_completions_invoke_stream_and_batch(lc, url, oa):
    llm = lc.OpenAI(base_url=url, api_key="unused", model="fake", max_retries=0, timeout=30, **KW)
    want = completion_answer(oa, PROMPTS)
    assert llm.invoke(PROMPTS[0]) == want[0]
    assert "".join(llm.stream(PROMPTS[1])) == completion_answer(oa, PROMPTS[1])[0]
    assert llm.batch(PROMPTS) == want


# -- litellm -----------------------------------------------------------------------------------------


@pytest.fixture
def litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the price list at import
    import litellm

    litellm.telemetry = False
    return litellm


def test_litellm_chat_stream_n_and_batches(litellm, url, oa):
    kw = dict(model="openai/fake", api_base=url, api_key="unused", num_retries=0, **KW)
    (want,) = chat_answer(oa)
    assert litellm.completion(messages=CHAT, **kw).choices[0].message.content == want
    chunks = litellm.completion(messages=CHAT, stream=True, **kw)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
    assert [c.message.content for c in litellm.completion(messages=CHAT, n=2, **kw).choices] == chat_answer(oa, n=2)
    texts = [[{"role": "user", "content": f"{i}: abc abc"}] for i in range(3)]
    got = litellm.batch_completion(messages=texts, **kw)
    assert [r.choices[0].message.content for r in got] == [chat_answer(oa, t)[0] for t in texts]
    r = litellm.text_completion(model="text-completion-openai/fake", api_base=url, api_key="unused", prompt=PROMPTS, **KW)
    assert [c.text for c in sorted(r.choices, key=lambda c: c.index)] == completion_answer(oa, PROMPTS)


# -- the real model ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_on_the_real_model_each_library_gets_the_openai_clients_answer(real_int8_model_dir, lc, litellm):
    """The default model behind the server: a seeded chat through langchain-openai and litellm,
    whole and streamed, is the openai client's answer, and so is a completions batch."""
    import openai

    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.tokenizer import Tokenizer

    from servers import live_server

    prims = OrtDecoderPrimitives(real_int8_model_dir, max_lanes=4, max_context=256)
    messages = [{"role": "user", "content": "List three colours."}]
    kw = dict(max_tokens=16, temperature=0.7, seed=3)
    try:
        with live_server(prims, tokenizer=Tokenizer.load(real_int8_model_dir), model_name="smollm2") as live:
            url = f"{live.url}/v1"
            oa = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
            want = oa.chat.completions.create(model="smollm2", messages=messages, **kw).choices[0].message.content
            assert want
            chat = lc.ChatOpenAI(base_url=url, api_key="unused", model="smollm2", max_retries=0, timeout=120, **kw)
            assert chat.invoke(messages[0]["content"]).content == want
            assert "".join(c.content for c in chat.stream(messages[0]["content"])) == want
            lkw = dict(model="openai/smollm2", api_base=url, api_key="unused", num_retries=0, **kw)
            assert litellm.completion(messages=messages, **lkw).choices[0].message.content == want
            assert "".join(c.choices[0].delta.content or "" for c in litellm.completion(messages=messages, stream=True, **lkw)) == want
            prompts = ["The capital of France is", "def add(a, b):"]
            batch = [c.text for c in sorted(oa.completions.create(model="smollm2", prompt=prompts, **kw).choices, key=lambda c: c.index)]
            assert lc.OpenAI(base_url=url, api_key="unused", model="smollm2", max_retries=0, **kw).batch(prompts) == batch
    finally:
        prims.close()

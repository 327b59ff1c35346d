"""The routes (sf_trt/serve/) through a real uvicorn, with the official openai client
and httpx: responses, streams, fields, errors, metrics, disconnects, backpressure."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import openai
import pytest

from sf_trt.abi import Sampling, SamplingParams
from sf_trt.engine_loop import LoopConfig
from sf_trt.fake import FakePrimitives
from sf_trt.generate import Generator
from sf_trt.scheduler import DraftPolicy, Request, SchedulerConfig, choice_key

from servers import FAKE, TOK, POISON, FaultyFake, SlowFake, live_server, wait_for

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"


def alone(prompt_ids, *, temperature, seed, max_tokens, top_p=1.0, stop=(), speculate=False):
    """What the engine alone emits for a request (speculation off by default)."""
    mode = Sampling.GPU_GREEDY if temperature == 0 else Sampling.GPU_GUMBEL
    params = SamplingParams(temperature=temperature or 1.0, top_p=top_p, max_tokens=max_tokens)
    (res,) = Generator(FakePrimitives(FAKE), tokenizer=TOK).run([Request(prompt_ids, mode, params, seed=seed, speculate=speculate, stop=stop)])
    return res


def chat_ids(text: str) -> list[int]:
    return TOK.encode(TOK.apply_chat_template([{"role": "user", "content": text}]))


# -- responses ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_chat_and_completion_answer_what_the_engine_answers_alone(client, temperature):
    r = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": PROMPT}], max_tokens=40,
                                       temperature=temperature, seed=11, extra_body={"sf_trt": {"return_token_ids": True}})
    want = alone(chat_ids(PROMPT), temperature=temperature, seed=11, max_tokens=40)
    c = r.choices[0]
    assert c.message.content == want.text and c.model_extra["token_ids"] == want.tokens
    assert c.finish_reason == "length" and r.usage.completion_tokens == 40 and r.usage.prompt_tokens == len(chat_ids(PROMPT))
    assert r.object == "chat.completion" and r.model == "fake" and r.model_extra["sf_trt"] == {"seed": 11}
    r = client.completions.create(model="fake", prompt=PROMPT, max_tokens=40, temperature=temperature, seed=11)
    want = alone(TOK.encode(PROMPT), temperature=temperature, seed=11, max_tokens=40)
    assert r.choices[0].text == want.text and r.object == "text_completion"


def test_streams_add_up_to_the_answer_and_end_with_usage_and_done(client, fake_server):
    kw = dict(model="fake", messages=[{"role": "user", "content": PROMPT}], max_tokens=50, temperature=0.7, seed=5)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 50
    # the raw stream ends with data: [DONE]
    with httpx.stream("POST", f"{fake_server.url}/v1/completions", json={"prompt": "ab", "max_tokens": 5, "stream": True}, timeout=30) as resp:
        lines = [line for line in resp.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and resp.headers["content-type"].startswith("text/event-stream")


def test_speculation_on_and_off_give_the_same_answer_and_usage_counts_the_drafts(client):
    outs = {}
    for spec in ("none", "prompt-lookup"):
        outs[spec] = client.completions.create(model="fake", prompt=PROMPT, max_tokens=60, temperature=0.9, seed=2,
                                               extra_body={"sf_trt": {"speculate": spec, "max_draft": 4}})
    assert outs["none"].choices[0].text == outs["prompt-lookup"].choices[0].text
    plain, spec = outs["none"].usage.model_extra["sf_trt"], outs["prompt-lookup"].usage.model_extra["sf_trt"]
    assert plain == {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0}
    assert spec["num_draft_tokens"] > 0 and 0 < spec["num_accepted_tokens"] <= spec["num_draft_tokens"]
    assert spec["num_draft_tokens"] <= 4 * spec["num_drafts"]


def test_every_drafter_gives_the_plain_answer_and_the_suffix_corpus_is_scoped_by_user():
    """``sf_trt.speculate`` names any drafter; the suffix drafter's corpus is per ``user``:
    a request drafts from the same user's earlier ones, never from another user's. (The
    policy drafts every tick here, so the drafts depend on the corpus alone.)"""
    prompt = "a quick brown fox jumps over a lazy dog; then it naps by the old oak tree"
    with live_server(config=LoopConfig(scheduler=SchedulerConfig.serving(policy=DraftPolicy()))) as live, \
            openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", timeout=30, max_retries=0) as client:
        _check_drafters_and_scopes(client, prompt)


def _check_drafters_and_scopes(client, prompt: str) -> None:
    def ask(speculate: str, user: str):
        r = client.completions.create(model="fake", prompt=prompt, max_tokens=48, temperature=0.8, seed=9, user=user,
                                      extra_body={"sf_trt": {"speculate": speculate}})
        return r.choices[0].text, r.usage.model_extra["sf_trt"]["num_accepted_tokens"]

    plain, _ = ask("none", "u0")
    assert ask("prompt-lookup", "u0")[0] == plain
    first_a = ask("suffix", "tenant-a")
    again_a = ask("suffix", "tenant-a")  # drafts from tenant-a's first answer too
    first_b = ask("suffix", "tenant-b")  # tenant-a's text is not in tenant-b's corpus
    assert first_a[0] == again_a[0] == first_b[0] == plain
    assert again_a[1] > first_a[1] and first_b[1] == first_a[1]


def test_n_choices_are_independent_streams_keyed_by_seed_and_index(client):
    r = client.completions.create(model="fake", prompt="abc abd abe", max_tokens=30, temperature=1.0, seed=9, n=4,
                                  extra_body={"sf_trt": {"return_token_ids": True}})
    ids = [c.model_extra["token_ids"] for c in sorted(r.choices, key=lambda c: c.index)]
    assert len({tuple(x) for x in ids}) == 4
    for i, got in enumerate(ids):
        assert got == alone(TOK.encode("abc abd abe"), temperature=1.0, seed=choice_key(9, i), max_tokens=30).tokens
    assert r.usage.completion_tokens == sum(map(len, ids)) and r.usage.prompt_tokens == len("abc abd abe")


def test_a_request_without_a_seed_gets_one_back_that_reproduces_it(client):
    first = client.completions.create(model="fake", prompt=PROMPT, max_tokens=30, temperature=1.0)
    seed = first.model_extra["sf_trt"]["seed"]
    assert isinstance(seed, int) and 0 <= seed < 2**63
    again = client.completions.create(model="fake", prompt=PROMPT, max_tokens=30, temperature=1.0, seed=seed)
    assert again.choices[0].text == first.choices[0].text


def test_stop_strings_cut_the_text_and_nothing_after_them_is_streamed(client):
    base = alone(TOK.encode(PROMPT), temperature=0.0, seed=0, max_tokens=80).text
    stop = base[25:28]
    at = base.find(stop)
    for spec in ("none", "prompt-lookup"):
        kw = dict(model="fake", prompt=PROMPT, max_tokens=80, temperature=0, stop=[stop, "\x01unused"], extra_body={"sf_trt": {"speculate": spec}})
        r = client.completions.create(**kw)
        c = r.choices[0]
        assert c.text == base[:at] and c.finish_reason == "stop" and c.model_extra["stop_reason"] == stop
        streamed = "".join(ch.choices[0].text for ch in client.completions.create(**kw, stream=True) if ch.choices)
        assert streamed == base[:at]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_logprobs_are_the_same_with_speculation_on_and_off(client, temperature):
    got = {}
    for spec in ("none", "prompt-lookup"):
        r = client.chat.completions.create(model="fake", messages=[{"role": "user", "content": PROMPT}], max_tokens=30, temperature=temperature,
                                           seed=4, logprobs=True, top_logprobs=3, extra_body={"sf_trt": {"speculate": spec}})
        got[spec] = r.choices[0].logprobs.model_dump()
        content = r.choices[0].logprobs.content
        assert len(content) == r.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in content)
        assert all(t.logprob <= 0 and t.top_logprobs[0].logprob >= t.logprob for t in content)
        text = bytes(b for t in content if t.token != "<|special:256|>" for b in t.bytes).decode("utf-8", "replace")
        assert text == r.choices[0].message.content
    assert got["none"] == got["prompt-lookup"]
    c = client.completions.create(model="fake", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=2,
                                  extra_body={"sf_trt": {"return_token_ids": True}})
    lp, ids = c.choices[0].logprobs, c.choices[0].model_extra["token_ids"]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10 and all(len(t) <= 2 for t in lp.top_logprobs)
    # offsets are characters of the text before each token (test_http.py: characters over several tokens)
    assert lp.text_offset == [len(TOK.decode(ids[:j], skip_special=True).rstrip("\ufffd")) for j in range(10)]


# -- errors --------------------------------------------------------------------------------------------


def post(server, path, body, **kw):
    return httpx.post(f"{server.url}{path}", json=body, timeout=30, **kw)


def envelope(resp):
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == resp.status_code
    return body["error"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "a", "max_tokenz": 3}, "max_tokenz"),
    ("/v1/completions", {"prompt": "a", "sf_trt": {"speculate": "none", "draft": 2}}, "sf_trt.draft"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a", "mood": "x"}]}, "messages.0.mood"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
])
def test_unknown_fields_are_a_400_that_names_them(fake_server, path, body, param):
    resp = post(fake_server, path, body)
    err = envelope(resp)
    assert resp.status_code == 400 and err["param"] == param and param.rsplit(".", 1)[-1] in err["message"]
    assert err["type"] == "BadRequestError"


@pytest.mark.parametrize("field, value", [
    ("response_format", {"type": "json_object"}), ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("tool_choice", "auto"),
])
def test_fields_sf_trt_cannot_honour_are_a_400_that_names_them(fake_server, field, value):
    resp = post(fake_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], field: value})
    err = envelope(resp)
    assert resp.status_code == 400 and err["param"] == field and field in err["message"] and "cannot honour" in err["message"]


def test_no_op_values_of_unsupported_fields_are_accepted(fake_server):
    body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 3, "presence_penalty": 0, "frequency_penalty": 0.0,
            "logit_bias": {}, "response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "user": "u1"}
    assert post(fake_server, "/v1/chat/completions", body).status_code == 200


@pytest.mark.parametrize("body, status, type_, words", [
    ({"prompt": "a", "model": "gpt-4"}, 404, "NotFoundError", "'gpt-4' does not exist"),
    ({"prompt": "a", "temperature": -1}, 400, "BadRequestError", "temperature"),
    ({"prompt": "a", "top_k": 65, "temperature": 1}, 400, "BAD_SAMPLING_PARAMS", "top_k 65 exceeds the sampler's limit 64"),
    ({"prompt": [300, 1]}, 400, "TOKEN_OUT_OF_VOCAB", "token 300 at index 0"),
    ({"prompt": "a" * 1030}, 400, "PROMPT_TOO_LONG", "context is 1024 tokens; the request needs at least 1030 tokens in the prompt (1030 bytes"),
    ({"prompt": [97] * 1030}, 400, "PROMPT_TOO_LONG", "context is 1024 tokens; the request needs 1030 tokens in the prompt"),
    ({"prompt": "a", "temperature": 2**63}, 400, "BadRequestError", "temperature: Input should be less than or equal to 2 (got 9223372036854775808)"),
    ({"prompt": "a", "temperature": "1"}, 400, "BadRequestError", "temperature: Input should be a valid number (got '1')"),
    ({"prompt": "a", "max_tokens": "5"}, 400, "BadRequestError", "max_tokens: Input should be a valid integer (got '5')"),
    ({"prompt": "a", "max_tokens": 5.0}, 400, "BadRequestError", "max_tokens: Input should be a valid integer (got 5.0)"),
    ({"prompt": "a", "stream": 1}, 400, "BadRequestError", "stream: Input should be a valid boolean (got 1)"),
    ({"prompt": "a", "skip_special_tokens": False}, 400, "BadRequestError", "unsupported field(s): skip_special_tokens"),
    ({"prompt": "abc", "max_tokens": 1022}, 400, "PROMPT_TOO_LONG", "1025 tokens (3 in the prompt, 1022 in the completion)"),
    ({"prompt": "a", "n": 17}, 400, "BadRequestError", "n"),
    ({"prompt": "a", "seed": -3}, 400, "BadRequestError", "seed"),
    ({"prompt": "a", "stop": [""]}, 400, "BadRequestError", "stop strings must not be empty"),
    ({"prompt": "a", "sf_trt": {"speculate": "medusa"}}, 400, "BadRequestError", "prompt-lookup"),
])
def test_refusals_use_the_envelope_with_a_type_and_a_message_that_says_why(fake_server, body, status, type_, words):
    resp = post(fake_server, "/v1/completions", body)
    err = envelope(resp)
    assert (resp.status_code, err["type"]) == (status, type_) and words in err["message"], err


def test_a_body_that_is_not_json_is_a_400(fake_server):
    resp = httpx.post(f"{fake_server.url}/v1/completions", content=b"{nope", headers={"content-type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and "not valid JSON" in envelope(resp)["message"]


def test_an_api_key_guards_the_v1_routes():
    with live_server(api_key="s3cret") as live:
        resp = post(live, "/v1/completions", {"prompt": "a", "max_tokens": 2})
        assert resp.status_code == 401 and envelope(resp)["type"] == "AuthenticationError"
        assert httpx.get(f"{live.url}/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401
        c = openai.OpenAI(base_url=f"{live.url}/v1", api_key="s3cret", max_retries=0)
        assert c.completions.create(model="fake", prompt="a", max_tokens=2).usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{live.url}/v1", api_key="wrong", max_retries=0).models.list()
        assert httpx.get(f"{live.url}/health").status_code == 200  # health and metrics stay open
        assert httpx.get(f"{live.url}/metrics").status_code == 200


# -- the other routes, metrics -----------------------------------------------------------------------


def test_models_version_health_and_metrics(client, fake_server):
    (m,) = client.models.list().data
    assert m.id == "fake" and m.owned_by == "sf_trt"
    assert httpx.get(f"{fake_server.url}/version").json()["version"]
    assert httpx.get(f"{fake_server.url}/health").json() == {"status": "ok"}
    text = httpx.get(f"{fake_server.url}/metrics").text
    for name in ("num_requests_running", "num_requests_waiting", "prompt_tokens_total", "generation_tokens_total",
                 "time_to_first_token_seconds_bucket", "time_per_output_token_seconds_bucket", "e2e_request_latency_seconds_bucket",
                 "spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
                 "client_disconnects_total"):
        assert f"sf_trt:{name}" in text, name


def test_health_is_503_while_the_model_loads():
    gate = threading.Event()

    def loader():
        gate.wait(20)
        from sf_trt.engine_loop import EngineLoop

        prims = FakePrimitives(FAKE)
        return EngineLoop(prims, tokenizer=TOK), TOK, 1024

    with live_server(loader=loader) as live:
        resp = httpx.get(f"{live.url}/health")
        assert resp.status_code == 503 and resp.json()["status"] == "loading"
        resp = post(live, "/v1/completions", {"prompt": "a"})
        assert resp.status_code == 503 and "loading" in envelope(resp)["message"]
        gate.set()
        wait_for(lambda: httpx.get(f"{live.url}/health").status_code == 200)
        assert post(live, "/v1/completions", {"prompt": "a", "max_tokens": 3}).status_code == 200


def test_usage_equals_the_tokens_streamed_equals_the_rise_of_the_generation_counter(fake_server):
    """64 concurrent streams: every token is accounted for."""
    before = fake_server.metric("sf_trt:generation_tokens_total")
    before_ok = fake_server.metric("sf_trt:request_success_total")

    async def one(client, i):
        body = {"prompt": f"stream {i} " * (1 + i % 4), "max_tokens": 10 + i % 17, "temperature": 0.5 + (i % 3) / 4, "seed": i,
                "stream": True, "stream_options": {"include_usage": True},
                "sf_trt": {"return_token_ids": True, "speculate": "none" if i % 2 else "prompt-lookup"}}
        ids, usage, done = [], None, False
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    obj = json.loads(line[6:])
                    usage = obj.get("usage") or usage
                    for ch in obj["choices"]:
                        ids += ch.get("token_ids", [])
        assert done and usage["completion_tokens"] == len(ids) == 10 + i % 17 or usage["completion_tokens"] == len(ids)
        return len(ids)

    async def main():
        async with httpx.AsyncClient(base_url=fake_server.url, timeout=60, limits=httpx.Limits(max_connections=64)) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(64))), 120)

    counts = asyncio.run(main())
    assert fake_server.metric("sf_trt:generation_tokens_total") - before == sum(counts)
    assert fake_server.metric("sf_trt:request_success_total") - before_ok == 64
    wait_for(lambda: fake_server.metric("sf_trt:num_requests_running") == 0)


# -- disconnects and backpressure ---------------------------------------------------------------------


def test_a_client_that_disconnects_frees_its_lane_and_is_counted():
    with live_server(SlowFake(FAKE)) as live:
        before = live.metric("sf_trt:client_disconnects_total")
        body = {"prompt": "abc abc", "max_tokens": 900, "stream": True, "sf_trt": {"ignore_eos": True, "speculate": "none"}}
        with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=30) as resp:
            it = resp.iter_lines()
            seen = [line for line in (next(it), next(it), next(it), next(it)) if line.startswith("data: ")]
            assert len(seen) >= 2 and live.engine.num_running == 1
        # the socket is closed: the lane is freed within a tick and the counter rises
        wait_for(lambda: live.engine.executor.lanes == [] and live.engine.num_running == 0)
        wait_for(lambda: live.metric("sf_trt:client_disconnects_total") == before + 1)
        assert live.metric("sf_trt:request_success_total", finished_reason="abort") == 1
        # the same for a request that does not stream
        async def leave():
            async with httpx.AsyncClient(base_url=live.url, timeout=30) as c:
                task = asyncio.create_task(c.post("/v1/completions", json={**body, "stream": False}))
                await asyncio.sleep(0.3)
                task.cancel()
        asyncio.run(leave())
        wait_for(lambda: live.metric("sf_trt:client_disconnects_total") == before + 2)
        wait_for(lambda: live.engine.executor.lanes == [])


def test_above_the_queue_limit_429_with_retry_after_and_nothing_lost_below_it():
    cfg = FAKE.__class__(**{**FAKE.__dict__, "max_lanes": 1})
    with live_server(SlowFake(cfg), config=LoopConfig(max_queued=2)) as live:
        body = {"prompt": "abcd", "max_tokens": 80, "temperature": 0.7, "seed": 3, "sf_trt": {"ignore_eos": True, "speculate": "none"}}

        async def main():
            async with httpx.AsyncClient(base_url=live.url, timeout=60) as c:
                running = asyncio.create_task(c.post("/v1/completions", json=body))
                await asyncio.to_thread(wait_for, lambda: live.engine.num_running == 1)
                queued = [asyncio.create_task(c.post("/v1/completions", json={**body, "seed": s})) for s in (4, 5)]
                await asyncio.to_thread(wait_for, lambda: live.engine.num_waiting == 2)
                over = await c.post("/v1/completions", json=body)
                return await running, [await q for q in queued], over

        first, queued, over = asyncio.run(main())
        assert over.status_code == 429 and over.headers["Retry-After"] == "1"
        err = envelope(over)
        assert err["type"] == "RateLimitError" and "--max-queued-requests 2" in err["message"]
        for resp, seed in zip([first, *queued], (3, 4, 5)):
            assert resp.status_code == 200
            want = alone(TOK.encode("abcd"), temperature=0.7, seed=seed, max_tokens=80)
            assert resp.json()["choices"][0]["text"] == TOK.decode(want.tokens, skip_special=True)


# -- backend faults ------------------------------------------------------------------------------------


def test_a_backend_fault_is_a_500_or_an_sse_error_event_and_the_server_goes_on():
    with live_server(FaultyFake(FAKE)) as live:
        c = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError, match="injected fault"):
            c.completions.create(model="fake", prompt=[1, 2, POISON], max_tokens=5)
        with pytest.raises(openai.APIError, match="injected fault"):
            list(c.completions.create(model="fake", prompt=[1, POISON], max_tokens=5, stream=True))
        with httpx.stream("POST", f"{live.url}/v1/completions", json={"prompt": [POISON], "max_tokens": 3, "stream": True}) as resp:
            lines = [line for line in resp.iter_lines() if line]
        assert lines[-3] == "event: error" and json.loads(lines[-2][6:])["error"]["type"] == "InternalServerError"
        assert lines[-1] == "data: [DONE]"
        assert c.completions.create(model="fake", prompt="fine", max_tokens=5, temperature=0)  # greedy: a sampled token may be POISON itself.usage.completion_tokens == 5
        assert live.metric("sf_trt:request_success_total", finished_reason="error") == 3

"""The prefix cache behind the server: a conversation's next turn reports its cached prompt tokens in
``usage.prompt_tokens_details.cached_tokens`` and answers what a server without the cache answers;
prefixes are shared only within one ``user``; the hit and query counters add up."""

from __future__ import annotations

import json

import httpx

from sf_trt.engine_loop import LoopConfig
from sf_trt.executor import ExecutorConfig

from servers import live_server

CACHED = LoopConfig(executor=ExecutorConfig(prefix_cache_mb=8))
TURN1 = "The quick brown fox jumps over the lazy dog. " * 4


def complete(url: str, prompt: str, user: str | None, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0.8, "seed": 11, **extra}
    if user is not None:
        body["user"] = user
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def conversation(url: str, user: str | None) -> list[dict]:
    first = complete(url, TURN1, user)
    second = complete(url, TURN1 + first["choices"][0]["text"] + " And then?", user)
    return [first, second]


def test_a_next_turn_reports_cached_tokens_and_answers_the_same():
    with live_server(config=CACHED) as on, live_server() as off:
        got, want = conversation(on.url, "alice"), conversation(off.url, "alice")
        assert [r["choices"][0]["text"] for r in got] == [r["choices"][0]["text"] for r in want]
        cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in got]
        assert cached[0] == 0 and cached[1] >= len(TURN1) // 16 * 16
        assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in want] == [0, 0]
        # another user's identical turn finds nothing: prefixes are shared within a user only
        bob = complete(on.url, TURN1 + got[0]["choices"][0]["text"] + " And then?", "bob")
        assert bob["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert bob["choices"][0]["text"] == got[1]["choices"][0]["text"]
        prompts = sum(r["usage"]["prompt_tokens"] for r in got + [bob])
        assert on.metric("sf_trt:prefix_cache_queries_total") == prompts
        assert on.metric("sf_trt:prefix_cache_hits_total") == cached[1]
        assert off.metric("sf_trt:prefix_cache_queries_total") == 0  # no cache: nothing queried


def test_a_streamed_turn_reports_its_cached_tokens_in_the_usage_chunk():
    with live_server(config=CACHED) as on:
        first = complete(on.url, TURN1, None)
        body = {"prompt": TURN1 + first["choices"][0]["text"], "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{on.url}/v1/completions", json=body, timeout=60) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: {")]
        usage = json.loads(lines[-1][len("data: "):])["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= len(TURN1) // 16 * 16

"""The headline: a seeded request alone with speculation off answers, byte for byte, what it
answers among 16 concurrent mixed requests (greedy and sampled, speculating and not, some
cancelled midway: those stop at a prefix of it)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from sf_trt.engine_loop import LoopConfig
from sf_trt.executor import ExecutorConfig
from sf_trt.scheduler import DraftPolicy, SchedulerConfig

from servers import SlowFake, FAKE, live_server

PROMPTS = [
    "the cat sat on the mat. the cat sat on the mat. the",
    "def add(a, b): return a + b\ndef add(a, b):",
    "abc abd abe abf abg",
    "one two three one two three one",
]


def mixed_requests(n: int, prompts: list, max_tokens: int) -> list[dict]:
    out = []
    for i in range(n):
        sampled = i % 2 == 1
        body = {
            "max_tokens": max_tokens - 3 * (i % 4), "seed": 1000 + 17 * i, "temperature": 0.8 if sampled else 0.0,
            "top_p": 0.95 if i % 4 == 3 else 1.0, "min_p": 0.05 if i % 8 == 5 else 0.0,
            "sf_trt": {"return_token_ids": True, "speculate": "prompt-lookup" if i % 3 else "none", "max_draft": 2 + i % 6},
        }
        if i % 5 == 2:
            body["stop"] = ["\n\n", "the mat"]
        if i % 4 == 1:  # the logit adjustments: exact under load too
            body.update(presence_penalty=0.5, frequency_penalty=0.3)
        if i % 4 == 2:
            body.update(repetition_penalty=1.2, logit_bias={"32": 2.0, "101": -1.5})
        if i % 7 == 3:
            body["min_tokens"] = 10
        prompt = prompts[i % len(prompts)]
        if isinstance(prompt, list):
            body["messages"] = prompt
        else:
            body["prompt"] = prompt
        out.append(body)
    return out


def path_of(body: dict) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def text_of(choice: dict) -> str:
    return choice["message"]["content"] if "message" in choice else choice["text"]


async def alone_answers(client, bodies: list[dict]) -> list[tuple]:
    """Each request on its own, one after the other, speculation off."""
    out = []
    for body in bodies:
        b = {**body, "sf_trt": {**body["sf_trt"], "speculate": "none"}}
        resp = await client.post(path_of(b), json=b)
        assert resp.status_code == 200, resp.text
        c = resp.json()["choices"][0]
        out.append((c["token_ids"], text_of(c), c["finish_reason"]))
    return out


async def streamed(client, body: dict, cancel_after: int | None) -> tuple:
    """Stream one request; with ``cancel_after``, close the connection after that many chunks."""
    ids, text, finish, chunks = [], "", None, 0
    async with client.stream("POST", path_of(body), json={**body, "stream": True}) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            assert "error" not in obj, obj
            for c in obj["choices"]:
                ids += c.get("token_ids", [])
                text += (c.get("delta") or {}).get("content") or c.get("text") or ""
                finish = c.get("finish_reason") or finish
            chunks += 1
            if cancel_after is not None and chunks >= cancel_after:
                return ids, text, None  # leaving the block closes the connection
    return ids, text, finish


def check_headline(url: str, bodies: list[dict], cancelled: set[int], *, timeout_s: float) -> None:
    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=timeout_s) as client:
            alone = await alone_answers(client, bodies)
            together = await asyncio.wait_for(
                asyncio.gather(*(streamed(client, b, 3 if i in cancelled else None) for i, b in enumerate(bodies))), timeout_s
            )
            return alone, together

    alone, together = asyncio.run(main())
    for i, ((ids, text, finish), (a_ids, a_text, a_finish)) in enumerate(zip(together, alone)):
        if i in cancelled:
            assert ids == a_ids[: len(ids)] and a_text.startswith(text), i
        else:
            assert (ids, text, finish) == (a_ids, a_text, a_finish), f"request {i} differs under load"


def test_sixteen_concurrent_mixed_requests_each_answer_what_they_answer_alone():
    cfg = FAKE.__class__(**{**FAKE.__dict__, "max_lanes": 6})  # more requests than lanes: some wait, lanes are reused
    # every speculating lane drafts every tick (the load-aware default sheds drafts at 6 lanes,
    # which would leave how many drafts ran to the timing)
    # with the prefix cache on, as `sf-trt serve` runs: the requests under load start from what the
    # ones alone left in it, and must answer the same
    config = LoopConfig(scheduler=SchedulerConfig.serving(tick_tokens=5, policy=DraftPolicy()), executor=ExecutorConfig(prefix_cache_mb=64))
    with live_server(SlowFake(cfg), config=config) as live:
        bodies = mixed_requests(16, PROMPTS, 60)
        check_headline(live.url, bodies, cancelled={3, 10, 14}, timeout_s=120)
        assert live.metric("sf_trt:spec_decode_num_accepted_tokens_total") > 0  # drafts were taken under load
        assert live.metric("sf_trt:prefix_cache_hits_total") > 0  # and prefixes were taken from the cache


@pytest.mark.slow
def test_on_the_real_model_sixteen_concurrent_mixed_requests_answer_what_they_answer_alone(real_int8_model_dir):
    from sf_trt.backends.ort_decoder import OrtDecoderPrimitives
    from sf_trt.tokenizer import Tokenizer

    prims = OrtDecoderPrimitives(real_int8_model_dir, max_lanes=4, max_context=384)
    chats = [
        [{"role": "user", "content": "Rewrite with type hints: def add(a, b): return a + b"}],
        [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox"}],
        [{"role": "user", "content": "List three colours."}],
        [{"role": "user", "content": "Summarize: The cat sat on the mat. The cat sat on the mat all day long."}],
    ]
    config = LoopConfig(executor=ExecutorConfig(prefix_cache_mb=64))  # the prefix cache on, as `sf-trt serve` runs
    with live_server(prims, tokenizer=Tokenizer.load(real_int8_model_dir), model_name="smollm2", config=config) as live:
        check_headline(live.url, mixed_requests(16, chats, 24), cancelled={5, 12}, timeout_s=600)
        assert live.metric("sf_trt:prefix_cache_hits_total") > 0
    prims.close()

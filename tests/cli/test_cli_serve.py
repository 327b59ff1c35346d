"""``sf-trt serve`` as a process (cli/serve.py): it serves, and SIGTERM during load
drains it: new requests get 503 while every in-flight request finishes or ends with an
error event, none hangs, the process exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import httpx
import pytest

from cli_run import serve


def test_sigterm_during_load_finishes_or_fails_every_request_and_exits_0():
    proc, url = serve("--max-num-seqs", "4", "--drain-timeout", "1.5", "--max-context", "4096")
    started: list[int] = []  # the streams whose response began (a loaded machine may take a while to open 12)
    try:
        async def one(client, i):
            body = {"prompt": f"request {i}: abc abc abc", "max_tokens": 40 if i % 2 else 4000, "temperature": 0.7, "seed": i,
                    "stream": True, "sf_trt": {"ignore_eos": True}}
            ends = []
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                assert resp.status_code == 200
                started.append(i)
                event = None
                async for line in resp.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line == "data: [DONE]":
                        ends.append("done")
                    elif line.startswith("data: "):
                        obj = json.loads(line[6:])
                        if event == "error":
                            assert obj["error"]["type"] == "ServiceUnavailableError" and obj["error"]["code"] == 503
                            ends.append("error:" + obj["error"]["message"])
                        for c in obj.get("choices", []):
                            if c.get("finish_reason"):
                                ends.append(c["finish_reason"])
            return ends

        async def main():
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                tasks = [asyncio.create_task(one(client, i)) for i in range(12)]
                deadline = time.monotonic() + 20
                while len(started) < 12 and time.monotonic() < deadline:  # every stream answered: admitted or queued
                    await asyncio.sleep(0.05)
                assert len(started) == 12, f"only {len(started)} of 12 streams started"
                await asyncio.sleep(0.5)  # the long ones running
                proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                # while it drains it still listens: a new request is a 503, not a refused connection
                late = await client.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
                health = await client.get("/health")
                return await asyncio.wait_for(asyncio.gather(*tasks), 30), late, health

        t0 = time.monotonic()
        results, late, health = asyncio.run(main())
        assert late.status_code == 503 and late.json()["error"]["type"] == "ServiceUnavailableError"
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        rc = proc.wait(30)
        assert rc == 0, proc.stdout.read()
        assert time.monotonic() - t0 < 20
        for ends in results:
            assert ends[-1] == "done", ends  # every stream ended properly
            assert ends[0] == "length" or "the server is shutting down" in ends[0], ends
        assert any(e[0] == "length" for e in results) and any(e[0].startswith("error") for e in results)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_serve_answers_and_refuses_bad_flags():
    proc, url = serve("--served-model-name", "demo", "--api-key", "k")
    try:
        r = httpx.post(f"{url}/v1/completions", json={"model": "demo", "prompt": "abc", "max_tokens": 3}, headers={"Authorization": "Bearer k"})
        assert r.status_code == 200 and r.json()["model"] == "demo"
        assert httpx.get(f"{url}/v1/models").status_code == 401
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    bad = subprocess.run([sys.executable, "-m", "sf_trt.cli", "serve", "--max-num-seqs", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "expected lanes in 1..256, got 0" in bad.stderr


@pytest.mark.slow
def test_serve_with_no_model_flags_serves_the_default_model(real_int8_model_dir):
    """`sf-trt serve` on the embedded default model: /health turns 200 once it has loaded,
    the openai client gets an answer, and the seeded answer is the same with
    speculation on and off."""
    import openai

    proc, url = serve("--max-context", "512", fake=False, timeout_s=300)
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
        (model,) = client.models.list().data
        assert model.id == "SmolLM2-135M-Instruct.Q4_1"
        answers = [
            client.chat.completions.create(model=model.id, messages=[{"role": "user", "content": "Name three colours."}],
                                           max_tokens=24, seed=3, temperature=0.7, extra_body={"sf_trt": {"speculate": s}})
            for s in ("none", "prompt-lookup")
        ]
        assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
        assert answers[0].usage.completion_tokens > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_the_prefix_cache_flag_reaches_the_engine_and_a_backend_that_cannot_hold_it_runs_without(monkeypatch, caplog):
    """--prefix-cache-mb travels in the ServeConfig (what a Ray replica receives) to the executor."""
    import dataclasses

    from sf_trt.cli import build_parser
    from sf_trt.cli.serve_state import serve_config
    from sf_trt.entrypoints import serving

    args = build_parser().parse_args(["serve", "--backend", "fake", "--prefix-cache-mb", "8"])
    config = serve_config(args)
    assert config.loop.executor.prefix_cache_mb == 8
    engine = serving.server_state(config)[1]()[0]
    assert engine.executor.prefix_cache.budget_bytes == 8 << 20
    default = serve_config(build_parser().parse_args(["serve", "--backend", "fake"]))
    assert serving.server_state(default)[1]()[0].executor.prefix_cache.budget_bytes == 1024 << 20

    opened = serving.open_served

    def without_state_io(c):
        prims, tokenizer, max_context = opened(c)
        prims.capabilities = dataclasses.replace(prims.capabilities, state_bytes_per_token=0)
        return prims, tokenizer, max_context

    monkeypatch.setattr(serving, "open_served", without_state_io)
    with caplog.at_level("WARNING", logger="sf_trt.serve"):
        engine = serving.server_state(config)[1]()[0]
    assert engine.executor.prefix_cache is None
    assert "no prefix cache: FakePrimitives cannot save or load its state (--prefix-cache-mb 8 ignored)" in caplog.text


def test_the_first_token_tick_flag_reaches_the_scheduler():
    """--first-token-tick is on by default (the serving profile's), --no-first-token-tick turns it off."""
    from sf_trt.cli import build_parser
    from sf_trt.cli.serve_state import serve_config

    for flags, want in (([], True), (["--no-first-token-tick"], False), (["--first-token-tick"], True)):
        config = serve_config(build_parser().parse_args(["serve", "--backend", "fake", *flags]))
        assert config.loop.scheduler.first_token_tick is want, flags

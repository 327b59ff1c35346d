"""Helpers of the Ray Serve tests (tests/serve/test_ray*.py): the application deployed from
`sf-trt serve --ray` flags, the single-process server that answers the same requests,
seeded request bodies, and /metrics read per replica. Loopback only; every wait bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Iterator, Optional

import httpx

from cli_run import free_port  # noqa: F401 - the Ray tests' ports
from servers import live_server

PROMPTS = [
    "the cat sat on the mat. the cat sat on the mat. the",
    "def add(a, b): return a + b\ndef add(a, b):",
    "abc abd abe abf abg",
    "one two three one two three one",
]


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """A Ray head started in this process installs SIGTERM/SIGINT handlers and leaves them after
    shutdown: put the test process's back (other tests check what SIGTERM does)."""
    import signal

    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


def ray_args(*flags: str):
    """`sf-trt serve --ray --backend fake FLAGS`, parsed and resolved as the command does."""
    from sf_trt.cli.ray_app import parse_ray_flags

    return parse_ray_flags(["--backend", "fake", "--replica-cpus", "0.5", *flags])


@contextlib.contextmanager
def deployed(args) -> Iterator[Any]:
    """The application of ``args`` running on the Ray cluster this process joined; deleted after."""
    from ray import serve

    from sf_trt.cli.ray_deployment import APP_NAME, build_app

    serve.run(build_app(args), name=APP_NAME, route_prefix="/")
    try:
        yield args
    finally:
        serve.delete(APP_NAME)


def replica_states() -> dict[str, int]:
    """The ``sf_trt`` deployment's replicas by state (``{"RUNNING": 2}``)."""
    from ray import serve

    from sf_trt.cli.ray_deployment import APP_NAME, DEPLOYMENT

    app = serve.status().applications.get(APP_NAME)
    if app is None or DEPLOYMENT not in app.deployments:
        return {}
    return {str(getattr(k, "value", k)): v for k, v in app.deployments[DEPLOYMENT].replica_states.items() if v}


def wait_until(predicate, timeout_s: float, what: str, poll_s: float = 0.25) -> float:
    """Seconds it took ``predicate`` to hold; AssertionError naming ``what`` past ``timeout_s``."""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"{what}: not reached within {timeout_s}s")
        time.sleep(poll_s)
    return time.monotonic() - t0


def by_replica(url: str, name: str, **labels: str) -> dict[str, float]:
    """A metric of the whole deployment's /metrics, summed per ``replica`` label."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if not line.startswith(name) or line[len(name)] not in " {" or not all(f'{k}="{v}"' in line for k, v in labels.items()):
            continue
        replica = line.split('replica="', 1)[1].split('"', 1)[0] if 'replica="' in line else ""
        out[replica] = out.get(replica, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def bodies(n: int, max_tokens: int = 24, seed0: int = 500) -> list[dict]:
    """Seeded, varied requests: greedy and sampled, speculating and not, chat and completion, streamed and not."""
    out = []
    for i in range(n):
        body: dict[str, Any] = {
            "max_tokens": max_tokens - i % 5, "seed": seed0 + i, "temperature": 0.0 if i % 2 == 0 else 0.8,
            "stream": i % 3 == 0, "sf_trt": {"return_token_ids": True, "speculate": "none" if i % 4 == 1 else "prompt-lookup"},
        }
        if i % 7 == 3:
            body["messages"] = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
        else:
            body["prompt"] = PROMPTS[i % len(PROMPTS)]
        out.append(body)
    return out


async def answer(client: httpx.AsyncClient, body: dict) -> dict:
    """One request: ``{"status", "tokens", "text", "finish", "error"}`` (a stream read to its end)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    if not body.get("stream"):
        resp = await client.post(path, json=body)
        if resp.status_code != 200:
            return {"status": resp.status_code, "error": resp.text, "headers": dict(resp.headers)}
        c = resp.json()["choices"][0]
        text = c["message"]["content"] if "message" in c else c["text"]
        return {"status": 200, "tokens": c["token_ids"], "text": text, "finish": c["finish_reason"], "usage": resp.json()["usage"]}
    tokens, text, finish, error, done, usage = [], "", None, None, False, None
    async with client.stream("POST", path, json={**body, "stream_options": {"include_usage": True}}) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return {"status": resp.status_code, "error": resp.text, "headers": dict(resp.headers)}
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                obj = json.loads(line[6:])
                if "error" in obj:
                    error = obj["error"]
                    continue
                usage = obj.get("usage") or usage
                for c in obj["choices"]:
                    tokens += c.get("token_ids", [])
                    text += (c.get("delta") or {}).get("content") or c.get("text") or ""
                    finish = c.get("finish_reason") or finish
    if error is not None or not done:
        return {"status": 200, "error": error or "the stream ended without [DONE]", "tokens": tokens}
    return {"status": 200, "tokens": tokens, "text": text, "finish": finish, "usage": usage}


async def answer_all(url: str, reqs: list[dict], concurrency: int, timeout_s: float = 60.0) -> list[dict]:
    """Every request, ``concurrency`` at a time, each bounded by ``timeout_s``."""
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        async def one(body):
            async with sem:
                return await asyncio.wait_for(answer(client, body), timeout_s)

        return await asyncio.gather(*(one(b) for b in reqs))


def same(a: dict, b: dict) -> bool:
    return (a.get("tokens"), a.get("text"), a.get("finish")) == (b.get("tokens"), b.get("text"), b.get("finish"))


@contextlib.contextmanager
def single_process(args, model_name: Optional[str] = None) -> Iterator[str]:
    """The plain `sf-trt serve` over the backend ``args`` name (the same `open_served` the replicas run, at the
    fake's full speed: its pace never changes a token); its URL."""
    import dataclasses

    from sf_trt.cli.serve_state import serve_config
    from sf_trt.entrypoints.serving import open_served

    config = dataclasses.replace(serve_config(args), fake_pass_ms=0.0)
    prims, tokenizer, max_context = open_served(config)
    with live_server(prims, tokenizer=tokenizer, max_context=max_context, model_name=model_name or config.model_name) as live:
        yield live.url

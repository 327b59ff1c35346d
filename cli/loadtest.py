"""``sf-trt loadtest``: a bounded, loopback-only load generator that checks what it measures.

It sends ``--num-requests`` streamed chat (or completion) requests to an sf_trt
server on this machine, at a fixed or Poisson arrival rate under a concurrency
cap, within ``--max-seconds``. Every request is seeded (``--seed`` + its index),
asks for its token ids (``"sf_trt": {"return_token_ids": true}``) and for usage.
It reports vLLM's benchmark fields (``request_throughput``, ``output_throughput``,
``mean/median/p50/p90/p99`` of ``ttft_ms``, ``tpot_ms``, ``itl_ms`` per chunk,
``itl_per_token_ms`` and ``e2el_ms``) as JSON, and **fails** (exit 1) when:

* any response is a 5xx, or a stream carries an SSE ``error`` event or ends
  without ``[DONE]``, or the run outlives ``--max-seconds``;
* a request's streamed token ids differ in number from its ``usage.completion_tokens``,
  or the sum of ``completion_tokens`` differs from the increase of the server's
  ``sf_trt:generation_tokens_total`` (prompt tokens likewise) — so run it against
  a server nobody else is using;
* a seeded request's output under load differs from its answer alone (the first
  ``--verify`` requests are sent again one at a time, speculation off, afterwards).

429 answers (the server's queue was full) are counted as ``rejected``, not failures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from sf_trt.serve.limits import TEMPERATURE_MAX

from .bench import read_prompts
from .errors import CliError
from .flags import ranged

__all__ = ["add_loadtest_parser", "run_loadtest", "loadtest"]

DEFAULT_PROMPTS = [
    {"messages": [{"role": "user", "content": "Rewrite with type hints: def add(a, b): return a + b"}], "max_tokens": 48},
    {"messages": [{"role": "user", "content": "Summarize: The cat sat on the mat. The cat sat on the mat all day."}], "max_tokens": 48},
    {"messages": [{"role": "user", "content": "List three colours."}], "max_tokens": 32},
    {"messages": [{"role": "user", "content": "Repeat after me: alpha beta gamma delta, alpha beta gamma delta."}], "max_tokens": 48},
]


METRICS_SETTLE_S = 3.0
"""How long counters that disagree with the usage are read again: behind Ray Serve, each replica
reports its metrics about once a second (docs/deploy.md)."""


def _loopback(url: str) -> str:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return url.rstrip("/")
    try:
        if ipaddress.ip_address(host).is_loopback:
            return url.rstrip("/")
    except ValueError:
        pass
    raise CliError(f"--url {url}: the load generator talks to this machine only (127.0.0.0/8, ::1, localhost; got {host!r})")


@dataclasses.dataclass
class _Record:
    index: int
    status: int = 0
    ok: bool = False
    error: Optional[str] = None
    start: float = 0.0
    ttft: Optional[float] = None
    end: Optional[float] = None
    chunk_times: list = dataclasses.field(default_factory=list)
    chunk_tokens: list = dataclasses.field(default_factory=list)
    token_ids: list = dataclasses.field(default_factory=list)
    text: str = ""
    usage: Optional[dict] = None
    done: bool = False


def _percentiles(name: str, values: list[float]) -> dict:
    out = {}
    if not values:
        values = [0.0]
    xs = sorted(values)

    def q(p: float) -> float:
        if len(xs) == 1:
            return xs[0]
        k = (len(xs) - 1) * p / 100
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    out[f"mean_{name}"] = sum(xs) / len(xs)
    out[f"median_{name}"] = q(50)
    for p in (50, 90, 99):
        out[f"p{p}_{name}"] = q(p)
    return {k: round(v, 3) for k, v in out.items()}


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _body(args, row: dict, seed: int, *, speculate: Optional[str], stream: bool) -> tuple[str, dict]:
    body: dict[str, Any] = {"max_tokens": args.max_tokens or row.get("max_tokens", 64), "temperature": args.temperature,
                            "seed": seed, "stream": stream, "sf_trt": {"return_token_ids": True}}
    if args.model:
        body["model"] = args.model
    if speculate is not None:
        body["sf_trt"]["speculate"] = speculate
    if args.top_p is not None:
        body["top_p"] = args.top_p
    if stream:
        body["stream_options"] = {"include_usage": True}
    if "messages" in row:
        return "/v1/chat/completions", {**body, "messages": row["messages"]}
    return "/v1/completions", {**body, "prompt": row.get("prompt", row.get("prompt_ids"))}


async def _one(client, args, rec: _Record, path: str, body: dict) -> None:
    rec.start = time.perf_counter()
    try:
        async with client.stream("POST", path, json=body) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}"
                return
            event = None
            async for line in resp.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                    continue
                if not line.startswith("data:"):
                    if not line:
                        event = None
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    rec.done = True
                    break
                obj = json.loads(data)
                if event == "error" or "error" in obj:
                    rec.error = f"SSE error event: {json.dumps(obj.get('error', obj))[:300]}"
                    continue
                now = time.perf_counter()
                if obj.get("usage"):
                    rec.usage = obj["usage"]
                for choice in obj.get("choices", []):
                    ids = choice.get("token_ids") or []
                    piece = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
                    rec.text += piece or ""
                    if ids:
                        rec.token_ids += ids
                        rec.chunk_times.append(now)
                        rec.chunk_tokens.append(len(ids))
                        if rec.ttft is None:
                            rec.ttft = now - rec.start
    except Exception as exc:  # noqa: BLE001 - reported per request
        rec.error = f"{type(exc).__name__}: {exc}"
    finally:
        rec.end = time.perf_counter()
    rec.ok = rec.error is None and rec.done


async def loadtest(args) -> dict:
    """Run the load; the report (``report["failures"]`` empty when the run passed)."""
    import httpx

    url = _loopback(args.url)
    rows = _prompts(args)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    n = args.num_requests
    arrivals = _arrivals(args, n)
    limits = httpx.Limits(max_connections=args.max_concurrency or n, max_keepalive_connections=args.max_concurrency or n)
    failures: list[str] = []
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=httpx.Timeout(args.max_seconds), limits=limits) as client:
        before = (await client.get("/metrics")).text
        sem = asyncio.Semaphore(args.max_concurrency or n)
        records = [_Record(i) for i in range(n)]
        t0 = time.perf_counter()

        async def launch(i: int) -> None:
            await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
            async with sem:
                path, body = _body(args, rows[i % len(rows)], args.seed + i, speculate=args.speculate, stream=True)
                await _one(client, args, records[i], path, body)

        tasks = [asyncio.create_task(launch(i)) for i in range(n)]
        _, pending = await asyncio.wait(tasks, timeout=args.max_seconds)
        for t in pending:
            t.cancel()
        duration = time.perf_counter() - t0
        if pending:
            failures.append(f"{len(pending)} requests still running after --max-seconds {args.max_seconds}")
        completed = [r for r in records if r.ok]
        rejected = [r for r in records if r.status == 429]
        failures += _request_failures(records)
        usage = (sum(r.usage["completion_tokens"] for r in completed if r.usage), sum(r.usage["prompt_tokens"] for r in completed if r.usage))
        gen_delta, prompt_delta = await _metric_deltas(client, before, usage)
        if not pending and len(completed) + len(rejected) == n:
            if gen_delta != usage[0]:
                failures.append(f"usage sums to {usage[0]} completion tokens, /metrics generation_tokens_total rose by {gen_delta:g}")
            if prompt_delta != usage[1]:
                failures.append(f"usage sums to {usage[1]} prompt tokens, /metrics prompt_tokens_total rose by {prompt_delta:g}")
        verified = await _verify_alone(client, args, rows, completed[: args.verify], failures)
    report = {
        "completed": len(completed), "rejected": len(rejected), "failed": n - len(completed) - len(rejected),
        "num_requests": n, "duration": round(duration, 3),
        **_throughputs_and_latencies(completed, duration, *usage),
        "metrics_generation_tokens_delta": gen_delta, "verified_alone": verified,
        "settings": {"url": url, "request_rate": args.request_rate, "arrival": args.arrival, "max_concurrency": args.max_concurrency,
                     "temperature": args.temperature, "seed": args.seed, "speculate": args.speculate, "max_tokens": args.max_tokens},
        "failures": failures,
    }
    return report


def _arrivals(args, n: int) -> list[float]:
    """Each request's send time in seconds from the start: all at once, Poisson, or evenly spaced."""
    if math.isinf(args.request_rate):
        return [0.0] * n
    if args.arrival == "poisson":
        rng = random.Random(args.seed)
        t, arrivals = 0.0, []
        for _ in range(n):
            arrivals.append(t)
            t += rng.expovariate(args.request_rate)
        return arrivals
    return [i / args.request_rate for i in range(n)]


def _request_failures(records: list[_Record]) -> list[str]:
    """5xx and errors other than 429, and answers whose usage disagrees with what streamed."""
    out = []
    for r in records:
        if r.status >= 500 or (r.error is not None and r.status != 429):
            out.append(f"request {r.index}: {r.error}")
        elif r.ok and (r.usage is None or r.usage.get("completion_tokens") != len(r.token_ids)):
            out.append(f"request {r.index}: streamed {len(r.token_ids)} token ids, usage says {r.usage and r.usage.get('completion_tokens')}")
    return out


async def _metric_deltas(client, before: str, usage: tuple[int, int]) -> tuple[float, float]:
    """How much /metrics' generation and prompt token counters rose since ``before``; re-read
    for up to METRICS_SETTLE_S while they disagree with ``usage`` (a deployment's /metrics,
    sf-trt serve --ray, lags its replicas)."""

    def deltas(after: str) -> tuple[float, float]:
        return (_metric(after, "sf_trt:generation_tokens_total") - _metric(before, "sf_trt:generation_tokens_total"),
                _metric(after, "sf_trt:prompt_tokens_total") - _metric(before, "sf_trt:prompt_tokens_total"))

    got = deltas((await client.get("/metrics")).text)
    settle = time.perf_counter() + METRICS_SETTLE_S
    while got != usage and time.perf_counter() < settle:
        await asyncio.sleep(0.25)
        got = deltas((await client.get("/metrics")).text)
    return got


async def _verify_alone(client, args, rows: list[dict], records: list[_Record], failures: list[str]) -> int:
    """Send each of ``records`` again alone, speculation off; a different answer is a failure.
    Returns how many were checked."""
    verified = 0
    for r in records:
        path, body = _body(args, rows[r.index % len(rows)], args.seed + r.index, speculate="none", stream=False)
        resp = await client.post(path, json=body)
        if resp.status_code != 200:
            failures.append(f"request {r.index} alone: HTTP {resp.status_code}")
            continue
        choice = resp.json()["choices"][0]
        text = choice.get("message", {}).get("content") if "message" in choice else choice.get("text")
        if choice.get("token_ids") != r.token_ids or text != r.text:
            failures.append(f"request {r.index}: its output under load differs from its answer alone (seed {args.seed + r.index})")
        verified += 1
    return verified


def _throughputs_and_latencies(completed: list[_Record], duration: float, out_tokens: int, in_tokens: int) -> dict:
    """vLLM's benchmark fields: token counts, throughputs, TTFT, TPOT, ITL (per chunk and per token), E2E latency."""
    tpots = [(r.end - r.start - r.ttft) / (len(r.token_ids) - 1) for r in completed if r.ttft is not None and len(r.token_ids) > 1]
    itl, itl_tok = [], []
    for r in completed:
        for a, b, k in zip(r.chunk_times, r.chunk_times[1:], r.chunk_tokens[1:]):
            itl.append(b - a)
            itl_tok += [(b - a) / k] * k
    return {
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "request_throughput": round(len(completed) / duration, 3) if duration else 0.0,
        "output_throughput": round(out_tokens / duration, 2) if duration else 0.0,
        "total_token_throughput": round((in_tokens + out_tokens) / duration, 2) if duration else 0.0,
        **_percentiles("ttft_ms", [1000 * r.ttft for r in completed if r.ttft is not None]),
        **_percentiles("tpot_ms", [1000 * x for x in tpots]),
        **_percentiles("itl_ms", [1000 * x for x in itl]),
        **_percentiles("itl_per_token_ms", [1000 * x for x in itl_tok]),
        **_percentiles("e2el_ms", [1000 * (r.end - r.start) for r in completed]),
    }


def _prompts(args) -> list[dict]:
    if args.prompts is None:
        return DEFAULT_PROMPTS
    rows = []
    for p in read_prompts(args.prompts):
        row = {"max_tokens": p.max_tokens}
        for key in ("messages", "prompt", "prompt_ids"):
            if getattr(p, key) is not None:
                row[key] = getattr(p, key)
        rows.append(row)
    return rows


def add_loadtest_parser(sub: Any) -> None:
    p = sub.add_parser("loadtest", help="a bounded load test of a local sf_trt server, with correctness checks",
                       description=__doc__.split("\n\n", 1)[1].split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (this machine only; default http://127.0.0.1:8000)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--model", default=None, help="the model id to send (default: none, the server's)")
    p.add_argument("--prompts", type=Path, default=None, help="JSONL as for `sf-trt bench` (default: 4 built-in chat prompts)")
    p.add_argument("--num-requests", type=ranged(int, 1, 100000, what="a count in 1..100000"), default=32)
    p.add_argument("--max-seconds", type=ranged(float, 1.0, what="seconds >= 1"), default=120.0,
                   help="wall-time bound: requests still running then fail the run (default 120)")
    p.add_argument("--request-rate", type=ranged(float, 0.0, lo_open=True, what="requests/s > 0 (inf: all at once)"),
                   default=math.inf, help="arrivals per second (default inf: all at once)")
    p.add_argument("--arrival", choices=("fixed", "poisson"), default="poisson", help="arrival process at --request-rate (default poisson)")
    p.add_argument("--max-concurrency", type=ranged(int, 1, what="a cap >= 1"), default=None, help="requests in flight at most (default: no cap)")
    p.add_argument("--max-tokens", type=ranged(int, 1, what="tokens >= 1"), default=None, help="override each prompt's max_tokens")
    p.add_argument("--temperature", type=ranged(float, 0.0, TEMPERATURE_MAX, what=f"a temperature in 0..{TEMPERATURE_MAX:g}"), default=0.8)
    p.add_argument("--top-p", type=ranged(float, 0.0, 1.0, lo_open=True, what="top-p in (0, 1]"), default=None)
    p.add_argument("--seed", type=ranged(int, 0, 2**62, what="a seed >= 0"), default=1000, help="request i is seeded seed + i")
    p.add_argument("--speculate", choices=("none", "prompt-lookup"), default=None, help="per-request speculation (default: the server's)")
    p.add_argument("--verify", type=ranged(int, 0, what="a count >= 0"), default=8,
                   help="send the first N completed requests again alone, speculation off, and compare (default 8)")
    p.add_argument("--json", type=Path, default=None, help="also write the report to this file")
    p.set_defaults(func=run_loadtest)


def run_loadtest(args) -> int:
    report = asyncio.run(loadtest(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    for f in report["failures"]:
        print(f"sf-trt loadtest: FAIL: {f}", file=sys.stderr)
    return 1 if report["failures"] else 0

"""`sf-trt serve --ray` (cli/serve_ray.py, cli/ray_app.py): replicas of the server behind Ray
Serve's proxy answer what the single-process server answers; Ray's queue limit is a 429
with Retry-After in OpenAI's envelope; a client that goes away frees its lane in the
replica; autoscaling goes 1 -> 2 -> 1; /metrics covers the whole deployment; every turn of a
`user` reaches the replica that holds its conversation's prefix.

One local Ray cluster (4 logical CPUs) serves the module; each test deploys the
application from `sf-trt serve --ray` flags and deletes it. Loopback only, bounded."""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import httpx
import pytest

from ray_serving import (answer, answer_all, bodies, by_replica, deployed, ray_args, replica_states, same, signal_handlers_kept,
                         single_process, wait_until)

from sf_trt.cli import main
from sf_trt.cli.errors import CliError
from sf_trt.cli.ray_app import parse_ray_flags
from sf_trt.cli.serve_ray import resolve_ray_flags

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[test,ray]')")


@pytest.fixture(scope="module")
def ray_url():
    """A local Ray cluster with Serve's proxy on a free loopback port, as `sf-trt serve --ray` starts it."""
    from sf_trt.cli.serve_ray import start_ray
    from sf_trt.serve.proxy import PROXY_CALLBACK_ENV

    before = os.environ.get(PROXY_CALLBACK_ENV)
    args = argparse.Namespace(host="127.0.0.1", port=0, ray_address=None)  # start_ray picks it once the cluster's processes hold theirs
    with signal_handlers_kept():
        t0 = time.monotonic()
        ray, serve, _ = start_ray(args, num_cpus=4, log_to_driver=False)
        print(f"ray cluster and serve up in {time.monotonic() - t0:.1f}s")
        try:
            yield f"http://127.0.0.1:{args.port}"
        finally:
            serve.shutdown()
            ray.shutdown()
            if before is None:
                os.environ.pop(PROXY_CALLBACK_ENV, None)


# -- flags -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    (["--replicas", "2"], "--replicas need(s) --ray"),
    (["--ray", "--replicas", "2", "--max-replicas", "3"], "not both"),
    (["--ray", "--min-replicas", "3", "--max-replicas", "2"], "--min-replicas 3 is above --max-replicas 2"),
    (["--ray", "--target-ongoing-requests", "4"], "need autoscaling"),
    (["--fake-pass-ms", "5"], "fake backend only"),
])
def test_ray_flags_that_do_not_fit_are_refused_in_one_line(argv, words, capsys):
    backend = [] if "--fake-pass-ms" in argv else ["--backend", "fake"]
    assert main(["serve", *backend, *argv]) == 1
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_ray_flag_defaults_follow_the_lanes_and_the_backend():
    a = parse_ray_flags(["--backend", "fake", "--max-num-seqs", "4", "--max-replicas", "3"])
    assert (a.min_replicas, a.max_replicas, a.target_ongoing_requests, a.max_ongoing_requests) == (1, 3, 4.0, 8)
    assert (a.replica_cpus, a.replica_gpus, a.retry_after, a.replicas) == (1.0, 0.0, 1.0, None)
    b = parse_ray_flags(["--backend", "tensorrt"])
    assert (b.replicas, b.replica_gpus) == (1, 1.0)
    with pytest.raises(CliError, match="--port: set by Ray Serve's config"):
        parse_ray_flags(["--port", "9000"])


def test_without_ray_installed_the_refusal_names_the_extra(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    assert main(["serve", "--ray", "--backend", "fake"]) == 1
    assert "pip install 'sf-trt[ray]'" in capsys.readouterr().err
    assert resolve_ray_flags(argparse.Namespace(ray=False, replicas=None)).ray is False


# -- the deployment ----------------------------------------------------------------------------------


def test_two_replicas_answer_200_requests_as_the_single_process_server_does(ray_url):
    args = ray_args("--replicas", "2")
    reqs = bodies(200)
    with single_process(args) as plain:
        want = asyncio.run(answer_all(plain, reqs, concurrency=16))
    t0 = time.monotonic()
    with deployed(args):
        print(f"2 replicas deployed in {time.monotonic() - t0:.1f}s")
        got = asyncio.run(answer_all(ray_url, reqs, concurrency=16))
        assert [g["status"] for g in got] == [200] * 200, [g for g in got if g["status"] != 200][:3]
        assert all("error" not in g for g in got), [g for g in got if "error" in g][:3]
        differ = [i for i, (g, w) in enumerate(zip(got, want)) if not same(g, w)]
        assert differ == [], f"requests {differ[:10]} answered differently behind Ray"
        # both replicas served some; the deployment's counter rose by the tokens every response counted
        served = {}
        wait_until(lambda: len(served.update(by_replica(ray_url, "sf_trt:request_success_total")) or served) == 2
                   and sum(served.values()) == 200, 15, "every replica's count in /metrics")
        assert min(served.values()) > 0, served
        tokens = sum(g["usage"]["completion_tokens"] for g in got)
        wait_until(lambda: sum(by_replica(ray_url, "sf_trt:generation_tokens_total").values()) == tokens, 15,
                   f"sf_trt:generation_tokens_total over the deployment == {tokens}")


def test_every_turn_of_a_user_after_the_first_starts_from_its_replicas_prefix_cache(ray_url):
    """8 users x 3 turns over 2 replicas: Ray's proxy keys each request by the hash of its `user`
    (sf_trt.serve.proxy.UserRoutingKey) and the router sends every turn of a user to the replica
    rendezvous hashing picks for it (sf_trt.cli.ray_router), so turns 2 and 3 find the conversation
    in that replica's prefix cache."""
    from sf_trt.cli.ray_router import rendezvous_order
    from sf_trt.serve.proxy import routing_key

    args = ray_args("--replicas", "2")
    users = [f"user-{i}" for i in range(8)]

    async def conversation(client: httpx.AsyncClient, user: str) -> list[int]:
        prompt, cached = f"{user} asks: the cat sat on the mat and the dog sat on the log. ", []
        for turn in range(3):
            body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "user": user, "stream": turn == 1, "sf_trt": {"return_token_ids": True}}
            got = await answer(client, body)
            assert got["status"] == 200 and "error" not in got, got
            cached.append(got["usage"]["prompt_tokens_details"]["cached_tokens"])
            prompt += got["text"] + f" then turn {turn + 2} says more about the cat and the dog. "
        return cached

    async def all_users() -> list[list[int]]:
        async with httpx.AsyncClient(base_url=ray_url, timeout=60) as client:
            return await asyncio.gather(*(asyncio.wait_for(conversation(client, u), 60) for u in users))

    with deployed(args):
        wait_until(lambda: len(by_replica(ray_url, "sf_trt:num_requests_running")) == 2, 30, "both replicas in /metrics")
        cached = asyncio.run(all_users())
        assert all(c[0] == 0 and c[1] > 0 and c[2] > c[1] for c in cached), cached
        replicas = sorted(by_replica(ray_url, "sf_trt:num_requests_running"))
        want: dict[str, float] = {}
        for user in users:
            home = rendezvous_order(routing_key(user), replicas)[0]
            want[home] = want.get(home, 0) + 3
        served: dict[str, float] = {}
        wait_until(lambda: (served.update(by_replica(ray_url, "sf_trt:request_success_total")) or served) == want, 15,
                   f"requests per replica as rendezvous hashing places the users ({want})")


def test_rendezvous_order_moves_only_the_keys_of_a_replica_that_goes():
    from sf_trt.cli.ray_router import rendezvous_order

    keys = [f"k{i}" for i in range(200)]
    three = {k: rendezvous_order(k, ["a", "b", "c"]) for k in keys}
    assert all(rendezvous_order(k, ["c", "a", "b"]) == three[k] for k in keys)  # the order given does not matter
    homes = [three[k][0] for k in keys]
    assert min(homes.count(r) for r in "abc") > 40  # spread over all three
    for k in keys:  # "b" goes: its keys move to their second choice, the others stay
        assert rendezvous_order(k, ["a", "c"])[0] == (three[k][1] if three[k][0] == "b" else three[k][0])


def test_above_rays_queue_limit_429_with_retry_after_in_openais_envelope_and_nothing_lost_below(ray_url):
    args = ray_args("--replicas", "1", "--max-num-seqs", "1", "--max-ongoing-requests", "1", "--max-queued-requests", "2",
                    "--fake-pass-ms", "10", "--retry-after", "2")
    body = {"prompt": "abcd", "max_tokens": 200, "temperature": 0.7, "sf_trt": {"ignore_eos": True, "speculate": "none", "return_token_ids": True}}
    reqs = [{**body, "seed": s} for s in (3, 4, 5)]  # 200 passes of 10 ms: each holds the one lane for 2 s
    with single_process(args) as plain:
        want = asyncio.run(answer_all(plain, reqs, concurrency=3))
    with deployed(args):
        async def main_():
            async with httpx.AsyncClient(base_url=ray_url, timeout=60) as c:
                running = asyncio.create_task(answer(c, reqs[0]))
                await asyncio.sleep(0.6)  # in the replica (its one ongoing request)
                queued = [asyncio.create_task(answer(c, r)) for r in reqs[1:]]
                await asyncio.sleep(0.4)  # both waiting in Ray's proxy: the queue is full
                over = await c.post("/v1/completions", json={**body, "seed": 6})
                return [await running, *[await q for q in queued]], over

        got, over = asyncio.run(main_())
    assert over.status_code == 429 and over.headers["retry-after"] == "2", (over.status_code, over.headers, over.text)
    err = over.json()["error"]
    assert err["type"] == "RateLimitError" and err["code"] == 429 and "max_queued_requests=2" in err["message"]
    assert [g["status"] for g in got] == [200, 200, 200]
    assert all(same(g, w) for g, w in zip(got, want))


def test_a_client_that_goes_away_frees_its_lane_in_the_replica(ray_url):
    args = ray_args("--replicas", "1", "--fake-pass-ms", "5")
    body = {"prompt": "abc abc", "max_tokens": 1500, "stream": True, "sf_trt": {"ignore_eos": True, "speculate": "none"}}
    with deployed(args):  # 1500 passes of 5 ms: the request alone would run for more than 7 s
        with httpx.stream("POST", f"{ray_url}/v1/completions", json=body, timeout=30) as resp:
            it = resp.iter_lines()
            seen = [line for line in (next(it), next(it), next(it), next(it)) if line.startswith("data: ")]
            assert len(seen) >= 2
            assert sum(by_replica(ray_url, "sf_trt:num_requests_running").values()) == 1
        took = wait_until(lambda: sum(by_replica(ray_url, "sf_trt:num_requests_running").values()) == 0
                          and sum(by_replica(ray_url, "sf_trt:client_disconnects_total").values()) == 1, 5, "the lane freed")
        print(f"stream closed: lane free after {took:.2f}s")
        assert sum(by_replica(ray_url, "sf_trt:request_success_total", finished_reason="abort").values()) == 1

        async def leave():  # the same for a request that does not stream
            async with httpx.AsyncClient(base_url=ray_url, timeout=30) as c:
                task = asyncio.create_task(c.post("/v1/completions", json={**body, "stream": False}))
                await asyncio.sleep(0.8)
                task.cancel()

        asyncio.run(leave())
        wait_until(lambda: sum(by_replica(ray_url, "sf_trt:num_requests_running").values()) == 0
                   and sum(by_replica(ray_url, "sf_trt:client_disconnects_total").values()) == 2, 5, "the second lane freed")


def test_autoscaling_goes_from_one_replica_to_two_under_load_and_back(ray_url):
    args = ray_args("--min-replicas", "1", "--max-replicas", "2", "--target-ongoing-requests", "2", "--upscale-delay", "0",
                    "--downscale-delay", "2", "--fake-pass-ms", "20")
    reqs = [{**b, "max_tokens": 60, "sf_trt": {**b["sf_trt"], "speculate": "none"}} for b in bodies(200, seed0=9000)]
    with deployed(args):
        assert replica_states() == {"RUNNING": 1}
        t0 = time.monotonic()

        async def load():
            """Six requests in flight until there are two replicas (or 90 s)."""
            got, i = {}, 0
            async with httpx.AsyncClient(base_url=ray_url, timeout=60) as c:
                pending = set()
                while time.monotonic() - t0 < 90 and i < len(reqs):
                    while len(pending) < 6 and i < len(reqs):
                        pending.add(asyncio.create_task(answer(c, reqs[i]), name=str(i)))
                        i += 1
                    done, pending = await asyncio.wait(pending, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
                    got.update({int(t.get_name()): t.result() for t in done})
                    if (await asyncio.to_thread(replica_states)).get("RUNNING") == 2:
                        break
                up = time.monotonic() - t0
                got.update({int(t.get_name()): await t for t in pending})
            return got, up

        got, up = asyncio.run(load())
        assert replica_states().get("RUNNING") == 2, "no second replica under load"
        print(f"scaled to 2 replicas after {up:.1f}s of load ({len(got)} requests)")
        with single_process(args) as plain:
            want = asyncio.run(answer_all(plain, [reqs[i] for i in sorted(got)], concurrency=8))
        assert all(g["status"] == 200 and same(g, w) for g, w in zip([got[i] for i in sorted(got)], want)), "an answer changed while scaling"
        down = wait_until(lambda: replica_states() == {"RUNNING": 1}, 60, "back to one replica once idle", poll_s=0.5)
        print(f"back to 1 replica {down:.1f}s after the load stopped")


@pytest.mark.slow
def test_two_replicas_of_the_real_model_answer_8_concurrent_seeded_requests_as_one_process_does(ray_url, real_int8_model_dir):
    """Each replica resolves the default model through the cache lock and loads its own engine.

    Each request names a ``user`` whose replica (rendezvous hashing of its key) is chosen so that
    four go to each: without one, Ray's router sends a request to the less loaded of two replicas
    as its sampled queue lengths say, and a burst of 8 may all land on one (it did, in CI)."""
    from sf_trt.cli.ray_router import rendezvous_order
    from sf_trt.serve.proxy import routing_key

    args = parse_ray_flags(["--replicas", "2", "--max-num-seqs", "4", "--max-context", "512"])
    prompts = ["Rewrite with type hints: def add(a, b): return a + b", "List three colours.",
               "Repeat after me: alpha beta gamma delta, alpha beta gamma delta.", "Summarize: the cat sat on the mat all day."]
    reqs = [{"messages": [{"role": "user", "content": prompts[i % 4]}], "max_tokens": 24, "seed": 40 + i, "stream": i % 2 == 1,
             "temperature": 0.0 if i < 4 else 0.9, "sf_trt": {"return_token_ids": True, "speculate": "none" if i % 3 == 0 else "prompt-lookup"}}
            for i in range(8)]
    with single_process(args) as plain:  # without a user: a user scopes the caches, never changes a token
        want = asyncio.run(answer_all(plain, reqs, concurrency=8, timeout_s=120))
    t0 = time.monotonic()
    with deployed(args):
        print(f"2 replicas of the real model up in {time.monotonic() - t0:.1f}s")
        wait_until(lambda: len(by_replica(ray_url, "sf_trt:num_requests_running")) == 2, 30, "both replicas in /metrics")
        replicas = sorted(by_replica(ray_url, "sf_trt:num_requests_running"))
        candidates = (f"user-{k}" for k in range(10_000))
        for i, body in enumerate(reqs):  # requests 0, 2, 4, 6 to one replica, 1, 3, 5, 7 to the other
            body["user"] = next(u for u in candidates if rendezvous_order(routing_key(u), replicas)[0] == replicas[i % 2])
        got = asyncio.run(answer_all(ray_url, reqs, concurrency=8, timeout_s=120))
        assert [g["status"] for g in got] == [200] * 8 and all("error" not in g for g in got), got
        assert [g["tokens"] for g in got] == [w["tokens"] for w in want]
        assert all(same(g, w) for g, w in zip(got, want))
        served: dict[str, float] = {}
        wait_until(lambda: (served.update(by_replica(ray_url, "sf_trt:request_success_total")) or served) == dict.fromkeys(replicas, 4.0), 15,
                   "four requests served by each replica in /metrics")

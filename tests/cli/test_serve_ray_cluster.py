"""`sf-trt serve --ray` beyond one process: two Ray nodes on this machine
(`ray.cluster_utils.Cluster`) where one dies under load, and the command itself,
which starts a local cluster and takes it all down on SIGTERM. Loopback only, bounded."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time

import httpx
import pytest

from cli_run import serve
from ray_serving import (answer_all, bodies, by_replica, deployed, free_port, ray_args, replica_states, same, signal_handlers_kept,
                         single_process, wait_until)

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install -e '.[test,ray]')")


@pytest.fixture(autouse=True)
def _signal_handlers_kept():
    with signal_handlers_kept():
        yield


def test_two_nodes_one_dies_under_load_survivors_answer_the_rest_fail_clearly_and_retry_identically():
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from sf_trt.serve.proxy import PROXY_CALLBACK, PROXY_CALLBACK_ENV

    before = os.environ.get(PROXY_CALLBACK_ENV)
    os.environ[PROXY_CALLBACK_ENV] = PROXY_CALLBACK
    # one CPU per node and one replica per node: one replica on each machine
    args = ray_args("--replicas", "2", "--replica-cpus", "1", "--max-replicas-per-node", "1", "--fake-pass-ms", "10")
    # each its own user: the router places them by rendezvous hashing, and the dead replica's users move to the survivor
    reqs = [{**b, "max_tokens": 120, "user": f"user-{i}", "sf_trt": {**b["sf_trt"], "ignore_eos": True}}
            for i, b in enumerate(bodies(24, seed0=7000))]
    with single_process(args) as plain:
        want = asyncio.run(answer_all(plain, reqs, concurrency=8))
    t0 = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        worker = cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        # the port picked once the cluster's processes hold theirs (one picked before them was
        # once taken by a Ray worker before the proxy bound it)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        with deployed(args):
            assert replica_states() == {"RUNNING": 2}
            print(f"two nodes, one replica on each, up in {time.monotonic() - t0:.1f}s")
            wait_until(lambda: len(by_replica(url, "sf_trt:num_requests_running")) == 2, 15, "both replicas in /metrics")

            async def load_and_kill():
                work = asyncio.create_task(answer_all(url, reqs, concurrency=24, timeout_s=60))
                running = {}
                while not (len(running) == 2 and min(running.values()) > 0):  # both replicas busy
                    running = await asyncio.to_thread(by_replica, url, "sf_trt:num_requests_running")
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(cluster.remove_node, worker, False)  # not graceful: the machine is gone
                print(f"worker node killed {time.monotonic() - t1:.1f}s into the load; requests running by replica: {running}")
                return await work

            t1 = time.monotonic()
            got = asyncio.run(load_and_kill())
            print(f"all {len(got)} requests ended {time.monotonic() - t1:.1f}s after the load began (none hangs: 60 s bound)")
            ok = [i for i, g in enumerate(got) if g["status"] == 200 and "error" not in g]
            failed = [i for i in range(len(got)) if i not in ok]
            for i in failed:
                print(f"  request {i}: status {got[i]['status']}, error {str(got[i]['error'])[:160]!r}")
            print(f"{len(ok)} answered, {len(failed)} failed with the dead node")
            assert ok, "the surviving node answered nothing"
            assert failed, "nothing failed with the node: the dead replica held no request"
            assert all(same(got[i], want[i]) for i in ok), "a survivor's answer changed"
            for i in failed:  # a clear error: OpenAI's envelope, or an SSE error event, or a stream cut without [DONE]
                g = got[i]
                err = g["error"]
                assert g["status"] in (200, 500, 503), g
                if g["status"] != 200:
                    assert '"error"' in err and ("died" in err or "unavailable" in err.lower() or "actor" in err.lower()), err
            # retried (on the survivor), each failed request answers exactly what it would have
            retried = asyncio.run(answer_all(url, [reqs[i] for i in failed], concurrency=8))
            assert all(r["status"] == 200 and same(r, want[i]) for r, i in zip(retried, failed)), retried
            # Ray notices the loss, then a new machine joins: the deployment is back to two replicas
            lost = wait_until(lambda: replica_states().get("RUNNING", 0) < 2, 60, "the lost replica noticed", poll_s=0.5)
            print(f"Ray saw the replica lost {lost:.1f}s after the retries: {replica_states()}")
            cluster.add_node(num_cpus=1)
            back = wait_until(lambda: replica_states() == {"RUNNING": 2}, 120, "two replicas again", poll_s=0.5)
            print(f"back to 2 running replicas {back:.1f}s after a node joined")
            again = asyncio.run(answer_all(url, reqs[:8], concurrency=8))
            assert all(g["status"] == 200 and same(g, w) for g, w in zip(again, want[:8]))
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        if before is None:
            os.environ.pop(PROXY_CALLBACK_ENV, None)


def test_the_command_starts_a_local_cluster_serves_and_takes_it_all_down_on_sigterm():
    tmp = tempfile.mkdtemp(prefix="sfray", dir="/tmp")  # short: Ray's socket paths live under it
    t0 = time.monotonic()
    proc, url = serve("--ray", "--replicas", "2", "--replica-cpus", "0.5", timeout_s=120, env={"RAY_TMPDIR": tmp})
    try:
        print(f"sf-trt serve --ray healthy after {time.monotonic() - t0:.1f}s")
        body = {"prompt": "abc abc abc", "max_tokens": 8, "seed": 1, "temperature": 0.8}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]
        assert httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"] == "fake"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, out
        assert "stopping" in out
        left = subprocess.run(["pgrep", "-f", tmp], capture_output=True, text=True).stdout.split()
        assert left == [], f"processes of the command's Ray cluster left running: {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)

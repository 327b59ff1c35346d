"""The Ray Serve deployments of ``sf-trt serve --ray`` (imports Ray: load it only when Ray is there).

One deployment, ``sf_trt``, whose replicas each own one engine: the server's own
app factory (:func:`sf_trt.serve.app.create_app`) wrapped with ``@serve.ingress``,
so every route, error and stream is the single-process server's. Ray places the
replicas, routes requests (by ``user``: :mod:`sf_trt.cli.ray_router`; at most ``max_ongoing_requests`` in a replica, up to
``max_queued_requests`` waiting in each proxy, 429 with ``Retry-After`` above), and
restarts what dies. A second deployment, ``sf_trt-metrics`` (one replica, no
CPU), gathers the replicas' metrics: each replica reports its registry every
:data:`METRICS_PUSH_S` seconds (and when it serves ``/metrics``), and ``/metrics``
answers every live replica's series, labelled ``replica``.

``build_app(args)`` is what ``sf-trt serve --ray`` runs (:mod:`sf_trt.cli.ray_app` builds
the same from flags for ``serve run`` and KubeRay).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ray import serve
from ray.serve.config import AutoscalingConfig, BackpressureConfig, RequestRouterConfig

from .ray_router import UserAffinityRouter

__all__ = ["APP_NAME", "DEPLOYMENT", "METRICS_DEPLOYMENT", "METRICS_PUSH_S", "MetricsHub", "SfTrtReplica", "build_app", "deployment_options"]

log = logging.getLogger("sf_trt.serve.ray")

APP_NAME = "sf_trt"
DEPLOYMENT = "sf_trt"
METRICS_DEPLOYMENT = "sf_trt-metrics"
METRICS_PUSH_S = 1.0
"""How often each replica reports its metrics to the hub."""
HUB_TIMEOUT_S = 5.0
"""A call to the hub waits no longer (while it is being replaced, calls would wait for it)."""
METRICS_STALE_S = 10.0
"""A replica silent this long (it died without saying goodbye) leaves ``/metrics``."""


@serve.deployment(name=METRICS_DEPLOYMENT, num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000,
                  logging_config={"enable_access_log": False})
class MetricsHub:
    """The replicas' latest metrics, by replica; ``render`` merges them into one exposition."""

    def __init__(self) -> None:
        self._texts: dict[str, tuple[bytes, float]] = {}

    def report(self, replica: str, text: bytes) -> None:
        self._texts[replica] = (text, time.monotonic())

    def forget(self, replica: str) -> None:
        self._texts.pop(replica, None)

    def render(self) -> bytes:
        from sf_trt.serve.metrics import merge_expositions

        return merge_expositions(text for text, _ in self._fresh().values())

    def _fresh(self) -> dict[str, tuple[bytes, float]]:
        now = time.monotonic()
        self._texts = {k: v for k, v in self._texts.items() if now - v[1] < METRICS_STALE_S}
        return self._texts


@serve.ingress()
class SfTrtReplica:
    """One engine behind Ray Serve. The model loads in the constructor, so Ray routes
    nothing here before it can serve; ``check_health`` fails once the engine has failed
    (Ray then replaces the replica)."""

    async def __init__(self, config: Any, hub: Any) -> None:
        from sf_trt.entrypoints.serving import server_state

        self.replica = serve.get_replica_context().replica_id.unique_id
        self.hub = hub
        self.state, loader = server_state(config, const_labels={"replica": self.replica})
        engine, tokenizer, max_context = await asyncio.to_thread(loader)
        self.state.engine, self.state.tokenizer, self.state.max_context = engine, tokenizer, max_context
        self.state.metrics_view = self._deployment_metrics
        self._pusher = asyncio.get_running_loop().create_task(self._push_metrics())
        log.info("replica %s: model %s loaded", self.replica, self.state.model_name)

    def __serve_build_asgi_app__(self):
        from sf_trt.serve.app import create_app

        return create_app(self.state)  # its lifespan starts the engine loop and drains it at shutdown

    async def _report(self) -> None:
        await asyncio.wait_for(self.hub.report.remote(self.replica, self.state.metrics.render()), HUB_TIMEOUT_S)

    async def _deployment_metrics(self) -> bytes:
        from sf_trt.serve.errors import ApiError

        try:
            await self._report()
            return await asyncio.wait_for(self.hub.render.remote(), HUB_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ApiError(503, "ServiceUnavailableError", f"the metrics hub ({METRICS_DEPLOYMENT}) did not answer within "
                           f"{HUB_TIMEOUT_S:g}s (it is being restarted?); retry shortly") from None

    async def _push_metrics(self) -> None:
        while True:
            try:
                await self._report()
            except Exception as exc:  # noqa: BLE001 - the hub restarting must not end the replica
                log.warning("replica %s: metrics not reported: %s", self.replica, exc)
            await asyncio.sleep(METRICS_PUSH_S)

    def check_health(self) -> None:
        engine = self.state.engine
        if engine is not None and engine.failure is not None:
            raise RuntimeError(f"the engine failed: {engine.failure}")

    async def __del__(self) -> None:
        self._pusher.cancel()
        # the hub may be gone already (the app is being deleted): a call to it would wait for a replica
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.hub.forget.remote(self.replica), timeout=0.5)


def deployment_options(args: Any) -> dict:
    """Ray Serve options of the ``sf_trt`` deployment, from ``sf-trt serve --ray``'s flags
    (defaults resolved by :func:`sf_trt.cli.serve_ray.resolve_ray_flags`)."""
    opts: dict[str, Any] = {
        "name": DEPLOYMENT,
        "ray_actor_options": {"num_cpus": args.replica_cpus, "num_gpus": args.replica_gpus},
        "max_ongoing_requests": args.max_ongoing_requests,
        "max_queued_requests": args.max_queued_requests,
        "backpressure_config": BackpressureConfig(status_code=429, retry_after_s=args.retry_after),
        "graceful_shutdown_timeout_s": args.drain_timeout + 5,
        "graceful_shutdown_wait_loop_s": 0.5,  # a replica being stopped looks this often whether its requests are done
        # every turn of a `user` to the replica whose prefix cache holds the conversation (cli/ray_router.py)
        "request_router_config": RequestRouterConfig(request_router_class=UserAffinityRouter),
    }
    if args.max_replicas_per_node is not None:
        opts["max_replicas_per_node"] = args.max_replicas_per_node
    if args.min_replicas is not None:
        look_back = max(1.0, min(30.0, args.downscale_delay))  # a short delay needs a short memory
        extra = {"metrics_interval_s": look_back / 2} if look_back <= 10.0 else {}  # Ray wants reports within the look-back
        opts["num_replicas"] = "auto"
        opts["autoscaling_config"] = AutoscalingConfig(
            min_replicas=args.min_replicas, max_replicas=args.max_replicas, initial_replicas=args.min_replicas,
            target_ongoing_requests=args.target_ongoing_requests, upscale_delay_s=args.upscale_delay,
            downscale_delay_s=args.downscale_delay, look_back_period_s=look_back, **extra,
        )
    else:
        opts["num_replicas"] = args.replicas
    return opts


def build_app(args: Any):
    """The application ``sf-trt serve --ray`` runs: the engine deployment over the metrics hub.
    Each replica receives the server's :class:`~sf_trt.entrypoints.serving.ServeConfig`, not the
    flags; Ray bounds what reaches a replica (``max_ongoing_requests``), and its engine queues those."""
    from .serve_state import serve_config

    hub = MetricsHub.bind()
    config = serve_config(args, max_queued=args.max_ongoing_requests)
    return serve.deployment(SfTrtReplica).options(**deployment_options(args)).bind(config, hub)


"""``sf-trt serve --ray``: the same server as replicas behind Ray Serve (docs/deploy.md).

``add_ray_flags(parser)`` adds the flags; ``resolve_ray_flags(args)`` checks them
once (a Ray flag without ``--ray``, ``--replicas`` with autoscaling, bounds that
cross) and fills the defaults that depend on others; ``run_serve_ray(args)`` joins
``--ray-address`` or starts a local Ray cluster, runs the application
(:mod:`sf_trt.cli.ray_deployment`), serves until SIGTERM / Ctrl+C, then deletes it
(replicas drain for ``--drain-timeout``) and stops the cluster it started.
This module imports Ray only when it runs; without Ray, ``--ray`` is a one-line
refusal naming the extra to install.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any

from .errors import CliError
from .flags import ranged

__all__ = ["add_ray_flags", "resolve_ray_flags", "import_ray", "start_ray", "run_serve_ray", "RAY_MISSING"]

RAY_MISSING = "sf-trt serve --ray needs Ray Serve, which is not installed here: pip install 'sf-trt[ray]'"

# dest -> the flag, for "needs --ray" refusals
_RAY_ONLY = {
    "replicas": "--replicas", "min_replicas": "--min-replicas", "max_replicas": "--max-replicas",
    "target_ongoing_requests": "--target-ongoing-requests", "upscale_delay": "--upscale-delay",
    "downscale_delay": "--downscale-delay", "ray_address": "--ray-address", "replica_cpus": "--replica-cpus",
    "replica_gpus": "--replica-gpus", "max_ongoing_requests": "--max-ongoing-requests",
    "max_replicas_per_node": "--max-replicas-per-node", "retry_after": "--retry-after",
}


def add_ray_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Ray Serve (--ray; docs/deploy.md)")
    g.add_argument("--ray", action="store_true",
                   help="serve through Ray Serve: replicas of this server, one engine each, behind Ray's HTTP proxy on "
                   "--host/--port (needs the ray extra: pip install 'sf-trt[ray]')")
    g.add_argument("--ray-address", default=None,
                   help="join this Ray cluster ('auto', or HEAD:6379); default: start a local one, stopped with the command")
    g.add_argument("--replicas", type=ranged(int, 1, what="replicas >= 1"), default=None,
                   help="a fixed number of replicas (default 1; not with --min-replicas/--max-replicas)")
    g.add_argument("--min-replicas", type=ranged(int, 0, what="replicas >= 0"), default=None,
                   help="autoscaling: the fewest replicas (default 1 when --max-replicas is given)")
    g.add_argument("--max-replicas", type=ranged(int, 1, what="replicas >= 1"), default=None,
                   help="autoscaling: the most replicas (default: --min-replicas when only it is given)")
    g.add_argument("--target-ongoing-requests", type=ranged(float, 0.0, lo_open=True, what="requests > 0"), default=None,
                   help="autoscaling: the requests per replica Ray aims for (default: --max-num-seqs, the lanes)")
    g.add_argument("--upscale-delay", type=ranged(float, 0.0, what="seconds >= 0"), default=None,
                   help="autoscaling: seconds of load above target before adding replicas (default 30)")
    g.add_argument("--downscale-delay", type=ranged(float, 0.0, what="seconds >= 0"), default=None,
                   help="autoscaling: seconds of load below target before removing replicas (default 600)")
    g.add_argument("--replica-cpus", type=ranged(float, 0.0, what="CPUs >= 0"), default=None,
                   help="CPUs Ray reserves for each replica (default 1)")
    g.add_argument("--replica-gpus", type=ranged(float, 0.0, what="GPUs >= 0"), default=None,
                   help="GPUs Ray reserves for each replica (default 0; 1 for --backend tensorrt or onnxruntime-cuda/-trt)")
    g.add_argument("--max-ongoing-requests", type=ranged(int, 1, what="requests >= 1"), default=None,
                   help="requests Ray sends one replica at once: its lanes plus its own queue (default 2 x --max-num-seqs); "
                   "more wait in Ray's proxy, up to --max-queued-requests, then 429")
    g.add_argument("--max-replicas-per-node", type=ranged(int, 1, what="replicas >= 1"), default=None,
                   help="at most this many replicas on one machine (default: no limit)")
    g.add_argument("--retry-after", type=ranged(float, 0.0, what="seconds >= 0"), default=None,
                   help="the Retry-After of Ray's 429s, in seconds (default 1)")


def resolve_ray_flags(args: argparse.Namespace) -> argparse.Namespace:
    """Check the Ray flags against each other and fill their defaults (in place)."""
    if not args.ray:
        given = [flag for dest, flag in _RAY_ONLY.items() if getattr(args, dest, None) is not None]
        if given:
            raise CliError(f"{', '.join(given)} need(s) --ray (serving through Ray Serve)")
        return args
    autoscale = args.min_replicas is not None or args.max_replicas is not None
    if autoscale and args.replicas is not None:
        raise CliError("--replicas is a fixed count; give it or --min-replicas/--max-replicas (autoscaling), not both")
    if not autoscale and any(getattr(args, d) is not None for d in ("target_ongoing_requests", "upscale_delay", "downscale_delay")):
        raise CliError("--target-ongoing-requests, --upscale-delay and --downscale-delay need autoscaling (--min-replicas/--max-replicas)")
    if autoscale:
        if args.min_replicas is None:
            args.min_replicas = min(1, args.max_replicas)
        if args.max_replicas is None:
            args.max_replicas = max(1, args.min_replicas)
        if args.min_replicas > args.max_replicas:
            raise CliError(f"--min-replicas {args.min_replicas} is above --max-replicas {args.max_replicas}")
        args.target_ongoing_requests = args.target_ongoing_requests or float(args.max_num_seqs)
        args.upscale_delay = 30.0 if args.upscale_delay is None else args.upscale_delay
        args.downscale_delay = 600.0 if args.downscale_delay is None else args.downscale_delay
    else:
        args.replicas = args.replicas or 1
    gpu_backend = args.backend in ("tensorrt", "onnxruntime-cuda", "onnxruntime-trt")
    args.replica_cpus = 1.0 if args.replica_cpus is None else args.replica_cpus
    args.replica_gpus = (1.0 if gpu_backend else 0.0) if args.replica_gpus is None else args.replica_gpus
    args.max_ongoing_requests = args.max_ongoing_requests or 2 * args.max_num_seqs
    args.retry_after = 1.0 if args.retry_after is None else args.retry_after
    return args


def import_ray():
    """``(ray, ray.serve)``, or a :class:`CliError` saying how to install them."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise CliError(RAY_MISSING) from None
    return ray, serve


def _proxy_env() -> None:
    """Ray's proxies wrap their own errors in OpenAI's envelope (sf_trt.serve.proxy); a local
    cluster inherits this variable, a joined one needs it set where it was started."""
    from sf_trt.serve.proxy import PROXY_CALLBACK, PROXY_CALLBACK_ENV

    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)


def start_ray(args: argparse.Namespace, *, num_cpus: float | None = None, log_to_driver: bool = True):
    """Join ``--ray-address`` or start a local cluster, then start Serve's proxy on
    ``--host``/``--port`` (``--port 0``: a port free once the cluster's own processes hold
    theirs, written back into ``args.port``). Returns ``(ray, serve, started_here)``."""
    ray, serve = import_ray()
    _proxy_env()
    started_here = args.ray_address is None
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": log_to_driver}
        if started_here:
            kwargs["num_cpus"] = num_cpus
        # "local": a new cluster of our own, never one that `ray start` left running here
        ray.init(address=args.ray_address or "local", **kwargs)
    if not args.port:  # picked now: a port picked before the cluster started could be taken by one of its workers
        args.port = _free_port(args.host)
    serve.start(http_options={"host": args.host, "port": args.port}, proxy_location="HeadOnly")
    return ray, serve, started_here


def _free_port(host: str) -> int:
    """A port nothing listens on at ``host`` now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def run_serve_ray(args: argparse.Namespace) -> int:
    """``sf-trt serve --ray``: run the application until SIGTERM / Ctrl+C, then take it down."""
    ray, serve, started_here = start_ray(args)
    from .ray_deployment import APP_NAME, build_app

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        where = "a local Ray cluster" if started_here else f"the Ray cluster at {args.ray_address}"
        scale = (f"{args.replicas} replica(s)" if args.min_replicas is None
                 else f"{args.min_replicas}..{args.max_replicas} replicas (autoscaling)")
        print(f"sf-trt serve --ray: starting {scale} on {where} (the model loads in each replica)", file=sys.stderr, flush=True)
        try:
            serve.run(build_app(args), name=APP_NAME, route_prefix="/", blocking=False)
        except RuntimeError as exc:  # Ray's DeploymentFailed: a replica's constructor raised (the model did not load ...)
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            raise CliError(f"the replicas did not start: {lines[-1] if lines else type(exc).__name__} "
                           "(replica logs: /tmp/ray/session_latest/logs/serve/)") from None
        print(f"sf-trt serve --ray: serving on http://{args.host}:{args.port} (Ctrl+C or SIGTERM to stop)", file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            pass
        print("sf-trt serve --ray: stopping (replicas drain their requests)", file=sys.stderr, flush=True)
    finally:
        # bounded: a cluster that lost its processes (a signal to the whole process group) must not hang the exit
        _bounded(lambda: serve.delete(APP_NAME), args.drain_timeout + 15, "deleting the application")
        if started_here:
            _bounded(serve.shutdown, 30, "stopping Serve")
            ray.shutdown()
    return 0


def _bounded(step, timeout_s: float, what: str) -> None:
    """Run ``step`` for at most ``timeout_s`` seconds (then go on, with a note)."""
    done = threading.Event()

    def run() -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - reported, then the shutdown goes on
            print(f"sf-trt serve --ray: {what} failed: {exc}", file=sys.stderr, flush=True)
        finally:
            done.set()

    threading.Thread(target=run, name=f"sf_trt-{what}", daemon=True).start()
    if not done.wait(timeout_s):
        print(f"sf-trt serve --ray: {what} took more than {timeout_s:g}s; going on", file=sys.stderr, flush=True)

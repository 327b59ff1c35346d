"""``sf-trt serve``: the OpenAI-compatible server (:mod:`sf_trt.serve`) from the command line.

``add_serve_parsers(subparsers)`` registers ``serve`` and ``loadtest``; ``run_serve(args)``
loads the model in the background (``/health`` answers 503 until it is ready),
serves with uvicorn (:mod:`sf_trt.serve.server`), and on SIGTERM or Ctrl+C stops
admitting (new requests get 503 while it drains), lets running requests finish
within ``--drain-timeout`` (then ends them with an error) and exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Any

from .errors import CliError
from .flags import add_model_flags, ranged
from .serve_ray import add_ray_flags, resolve_ray_flags, run_serve_ray
from .serve_state import FAKE_BACKEND, serve_config

__all__ = ["add_serve_parsers", "run_serve", "FAKE_BACKEND"]

def add_serve_parsers(sub: Any) -> None:
    """Register ``serve`` and ``loadtest`` on the ``sf-trt`` subparsers."""
    from sf_trt.engine_loop import LoopConfig
    from sf_trt.entrypoints.serving import ServeConfig
    from sf_trt.prefix_cache import DEFAULT_PREFIX_CACHE_MB
    from sf_trt.scheduler import DRAFTERS, SchedulerConfig
    from sf_trt.serve.limits import DEFAULT_KEEP_ALIVE_S, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_PROMPT_BYTES, DEFAULT_READ_TIMEOUT_S

    speculate_choices = ("none", *DRAFTERS)
    serving = SchedulerConfig.serving()

    p = sub.add_parser(
        "serve", help="an OpenAI-compatible server (completions, chat, streaming)",
        description="Serve the OpenAI API (POST /v1/completions, /v1/chat/completions; GET /v1/models, /health, "
        "/metrics, /version) on the default model (SmolLM2-135M-Instruct) or a given one. Output is the same "
        "with speculation on or off and alone or under load.",
    )
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    g.add_argument("--port", type=ranged(int, 0, 65535, what="a port in 0..65535"), default=8000, help="default 8000 (0: any free port)")
    g.add_argument("--api-key", default=os.environ.get("SF_TRT_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default: $SF_TRT_API_KEY, else none)")
    g.add_argument("--served-model-name", default=None, help="the model id clients send (default: the model directory's name)")
    g.add_argument("--max-num-seqs", type=ranged(int, 1, 256, what="lanes in 1..256"), default=8,
                   help="lanes: requests decoded at once (default 8)")
    g.add_argument("--max-queued-requests", type=ranged(int, 0, what="a queue length >= 0"), default=LoopConfig.max_queued,
                   help="requests that may wait when every lane is busy (0: none wait; with --ray: in each Ray proxy); more get 429 "
                   f"with Retry-After, and a batch larger than the lanes and this together a 400 (default {LoopConfig.max_queued})")
    g.add_argument("--drain-timeout", type=ranged(float, 0.0, what="seconds >= 0"), default=30.0,
                   help="on SIGTERM: seconds running requests may take to finish before they end with an error; new requests "
                   "get 503 meanwhile (default 30)")
    g.add_argument("--max-body-bytes", type=ranged(int, 1, what="bytes >= 1"), default=DEFAULT_MAX_BODY_BYTES,
                   help=f"a larger request body is a 413, refused before it is read (default {DEFAULT_MAX_BODY_BYTES})")
    g.add_argument("--max-prompt-bytes", type=ranged(int, 1, what="bytes >= 1"), default=DEFAULT_MAX_PROMPT_BYTES,
                   help="a longer prompt text (chat: the messages' contents together) is a 400 PROMPT_TOO_LONG, refused before "
                   f"it is tokenized (default {DEFAULT_MAX_PROMPT_BYTES})")
    g.add_argument("--read-timeout", type=ranged(float, 0.1, what="seconds >= 0.1"), default=DEFAULT_READ_TIMEOUT_S,
                   help="seconds a client has to send a request's line and headers (else the connection is closed), and then "
                   f"its body (else 408) (default {DEFAULT_READ_TIMEOUT_S:g})")
    g.add_argument("--keep-alive-timeout", type=ranged(float, 0.1, what="seconds >= 0.1"), default=DEFAULT_KEEP_ALIVE_S,
                   help=f"an idle keep-alive connection is closed after this (default {DEFAULT_KEEP_ALIVE_S:g})")
    g.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info")
    s = p.add_argument_group("scheduling and speculation")
    s.add_argument("--speculate", choices=speculate_choices, default="prompt-lookup",
                   help="the default for requests that do not say (per request: \"sf_trt\": {\"speculate\": ...}); default prompt-lookup")
    s.add_argument("--max-draft", type=ranged(int, 1, 256, what="a draft length in 1..256"), default=ServeConfig.max_draft,
                   help="default most draft tokens per verify pass (per request: \"sf_trt\": {\"max_draft\": N}); "
                   f"default {ServeConfig.max_draft}")
    s.add_argument("--tick-tokens", type=ranged(int, 1, 4096, what="tokens per tick in 1..4096"), default=serving.tick_tokens,
                   help=f"tokens each lane is asked for per engine tick: smaller streams sooner, larger ticks less (default {serving.tick_tokens})")
    s.add_argument("--first-token-tick", action=argparse.BooleanOptionalAction, default=serving.first_token_tick,
                   help="while a request's first token is due, the tick is one pass without drafts for every lane, so that token streams "
                   "one pass after its prompt's prefill instead of --tick-tokens passes after (default: on)")
    policy = serving.policy
    s.add_argument("--spec-row-budget", type=ranged(int, 1, 4096, what="rows >= 1"), default=policy.row_budget,
                   help="load-aware drafting: rows per pass speculation may fill; each of B lanes drafts at most "
                   f"budget // B - 1 tokens (default {policy.row_budget}; docs/serving.md)")
    s.add_argument("--spec-row-cost", type=ranged(float, 0.0, what="a cost >= 0"), default=policy.row_cost,
                   help="load-aware drafting: what one more row per lane costs, in passes, at many lanes (B lanes: "
                   f"cost * B / (B + {policy.row_cost_lanes:g})); the batch drafts while its drafts add more tokens per "
                   f"pass than their rows cost (default {policy.row_cost}; measure your machine: docs/serving.md)")
    s.add_argument("--spec-min-acceptance", type=ranged(float, 0.0, 1.0, what="a rate in [0, 1]"), default=policy.min_acceptance,
                   help="load-aware drafting: lanes whose recent drafts are accepted less often than this, or than a draft row "
                   f"costs at the batch size, send none (default {policy.min_acceptance})")
    s.add_argument("--prefill-budget", type=ranged(int, 1, what="tokens >= 1"), default=serving.prefill_budget,
                   help=f"prompt tokens prefilled per tick across lanes, beside the decoding lanes (default {serving.prefill_budget})")
    s.add_argument("--prefix-cache-mb", type=ranged(int, 0, what="MiB >= 0"), default=DEFAULT_PREFIX_CACHE_MB,
                   help="MiB of model state kept for prompt prefixes of earlier and running requests, shared only within one `user` (exact: a "
                   "request that starts from a cached prefix emits what it would without it; least recently used out "
                   f"first; 0: off; backends that cannot hold it, TensorRT, run without; default {DEFAULT_PREFIX_CACHE_MB})")
    add_model_flags(p, {FAKE_BACKEND: "the copy-model fake with a byte tokenizer (tests and demos, no model)"})
    add_ray_flags(p)
    p.add_argument_group("model").add_argument(
        "--fake-pass-ms", type=ranged(float, 0.0, 10_000.0, what="milliseconds in 0..10000"), default=0.0,
        help=f"with --backend {FAKE_BACKEND}: each forward pass also takes this long, a model's pace for scaling demos "
        "and tests (the tokens are the same; default 0)")
    p.set_defaults(func=run_serve)

    from .loadtest import add_loadtest_parser

    add_loadtest_parser(sub)


def build_server(args):
    """``(uvicorn server, state)`` for ``args``; the model loads when the server starts."""
    from sf_trt.entrypoints.serving import server_state
    from sf_trt.serve.app import create_app
    from sf_trt.serve.server import DrainingServer, uvicorn_config

    state, loader = server_state(serve_config(args))
    app = create_app(state, loader)
    config = uvicorn_config(app, host=args.host, port=args.port, log_level=args.log_level, read_timeout_s=args.read_timeout,
                            keep_alive_s=args.keep_alive_timeout, graceful_s=args.drain_timeout + 5)
    return DrainingServer(config, state), state


def run_serve(args) -> int:
    """``sf-trt serve``: serve until SIGTERM / Ctrl+C, then drain and exit 0."""
    if args.fake_pass_ms and args.backend != FAKE_BACKEND:
        raise CliError(f"--fake-pass-ms slows the fake backend only (got --backend {args.backend})")
    if resolve_ray_flags(args).ray:
        return run_serve_ray(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(name)s: %(message)s")
    server, state = build_server(args)
    # uvicorn re-raises the signal it caught once it has shut down; a handler that does
    # nothing lets the process exit 0 after the drain instead of dying by the signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    print(f"sf-trt serve: model {state.model_name!r} on http://{args.host}:{args.port} (loading; /health is 503 until ready)",
          file=sys.stderr, flush=True)
    server.run()
    return 0 if state.load_error is None else 1

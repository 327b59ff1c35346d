"""`sf-trt serve`'s flags as a :class:`~sf_trt.entrypoints.serving.ServeConfig`: what the
single-process server (cli/serve.py) builds its server from, and what each Ray Serve
replica (cli/ray_deployment.py) receives."""

from __future__ import annotations

import argparse
from typing import Optional

from sf_trt.entrypoints.serving import FAKE_BACKEND, ServeConfig

from .launch import backend_spec, model_spec

__all__ = ["FAKE_BACKEND", "serve_config"]


def serve_config(args: argparse.Namespace, *, max_queued: Optional[int] = None) -> ServeConfig:
    """The server ``args`` ask for (``max_queued``: the engine's queue, default ``--max-queued-requests``)."""
    from sf_trt.drafting import PromptLookupConfig
    from sf_trt.engine_loop import LoopConfig
    from sf_trt.executor import ExecutorConfig
    from sf_trt.scheduler import LoadAwareDrafting, SchedulerConfig

    scheduler = SchedulerConfig.serving(
        tick_tokens=args.tick_tokens, prefill_budget=args.prefill_budget, first_token_tick=args.first_token_tick, draft_config=PromptLookupConfig(max_draft=args.max_draft),
        policy=LoadAwareDrafting(row_budget=args.spec_row_budget, row_cost=args.spec_row_cost, min_acceptance=args.spec_min_acceptance),
    )
    loop = LoopConfig(
        max_queued=args.max_queued_requests if max_queued is None else max_queued, scheduler=scheduler,
        executor=ExecutorConfig(prefix_cache_mb=args.prefix_cache_mb),
    )
    return ServeConfig(
        model=model_spec(args), backend=backend_spec(args), max_num_seqs=args.max_num_seqs, max_context=args.max_context,
        served_model_name=args.served_model_name, api_key=args.api_key, speculate=args.speculate, max_draft=args.max_draft,
        drain_timeout_s=args.drain_timeout, fake_pass_ms=args.fake_pass_ms, loop=loop,
        max_body_bytes=args.max_body_bytes, max_prompt_bytes=args.max_prompt_bytes, read_timeout_s=args.read_timeout,
    )

"""What `sf-trt serve` builds before it serves, shared by the single-process server (cli/serve.py)
and each Ray Serve replica (cli/ray_deployment.py): the backend the flags name, the routes'
state, and the engine loop over them."""

from __future__ import annotations

import logging
from typing import Any

from .flags import DEFAULT_CONTEXT
from .launch import open_backend, resolve

log = logging.getLogger("sf_trt.serve")

__all__ = ["FAKE_BACKEND", "server_state", "open_served", "served_model_name"]

FAKE_BACKEND = "fake"
"""``--backend fake``: the copy-model fake with a byte tokenizer, for tests and demos (no model)."""
FAKE_VOCAB, FAKE_EOS = 257, 256


def open_served(args) -> tuple[Any, Any, int]:
    """``(primitives, tokenizer, max_context)`` for ``args``."""
    max_context = args.max_context or DEFAULT_CONTEXT
    if args.backend == FAKE_BACKEND:
        from sf_trt.fake import FakeConfig, FakePrimitives
        from sf_trt.tokenizer import ByteTokenizer

        cfg = FakeConfig(vocab=FAKE_VOCAB, eos=FAKE_EOS, copy_model=True, verify_rows=True, max_lanes=args.max_num_seqs,
                         max_context=max_context, max_rows_per_pass=max(1024, args.max_num_seqs), top_k_limit=64,
                         pass_delay_s=args.fake_pass_ms / 1000)
        return FakePrimitives(cfg), ByteTokenizer(FAKE_VOCAB, FAKE_EOS), max_context
    model = resolve(args, progress=False)
    prims = open_backend(args, model, max_lanes=args.max_num_seqs, max_context=max_context)
    return prims, model.tokenizer, max_context


def served_model_name(args) -> str:
    """The model id clients send: ``--served-model-name``, else the model's name."""
    if args.served_model_name:
        return args.served_model_name
    if args.backend == FAKE_BACKEND:
        return FAKE_BACKEND
    if args.model is not None:
        return args.model.name
    if args.gguf is not None:
        return args.gguf.name.removesuffix(".gguf")
    from sf_trt import models

    return models.DEFAULT_MODEL.model_name


def server_state(args, *, max_queued: int | None = None, const_labels: dict[str, str] | None = None):
    """``(state, loader)`` for ``args``: the routes' shared state, and what builds the engine
    loop (``max_queued``: the engine's queue, default ``--max-queued-requests``;
    ``const_labels``: labels on every metric, e.g. the Ray replica's)."""
    from sf_trt.drafting import PromptLookupConfig
    from sf_trt.engine_loop import EngineLoop, LoopConfig
    from sf_trt.executor import ExecutorConfig
    from sf_trt.scheduler import LoadAwareDrafting
    from sf_trt.serve.metrics import ServerMetrics
    from sf_trt.serve.state import ServerState

    name = served_model_name(args)
    state = ServerState(
        model_name=name, metrics=ServerMetrics(name, const_labels), api_key=args.api_key, default_speculate=args.speculate,
        default_max_draft=args.max_draft, drain_timeout_s=args.drain_timeout,
    )

    def loader():
        prims, tokenizer, max_context = open_served(args)
        if args.speculate != "none" and not (prims.capabilities.verify_rows and prims.capabilities.truncate_partial):
            state.default_speculate = "none"
        prefix_cache_mb = args.prefix_cache_mb
        if prefix_cache_mb and not prims.capabilities.state_bytes_per_token:
            log.warning("no prefix cache: %s cannot save or load its state (--prefix-cache-mb %d ignored)", type(prims).__name__, prefix_cache_mb)
            prefix_cache_mb = 0
        config = LoopConfig(
            max_queued=args.max_queued_requests if max_queued is None else max_queued, tick_tokens=args.tick_tokens,
            prefill_budget=args.prefill_budget, draft_config=PromptLookupConfig(max_draft=args.max_draft),
            policy=LoadAwareDrafting(row_budget=args.spec_row_budget, row_cost=args.spec_row_cost, min_acceptance=args.spec_min_acceptance),
            executor=ExecutorConfig(prefix_cache_mb=prefix_cache_mb),
        )
        return EngineLoop(prims, tokenizer=tokenizer, config=config, observer=state.metrics), tokenizer, max_context

    return state, loader

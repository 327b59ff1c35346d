"""``sf-trt serve``: an OpenAI-compatible HTTP server over the engine loop.

A thin shell: :mod:`.schemas` (request bodies, unknown fields refused),
:mod:`.app` (routes, errors, SSE), :mod:`.metrics` (Prometheus, vLLM's names),
:mod:`.cli` (the subcommands) and :mod:`.loadtest` (a bounded load generator).
The engine loop (:mod:`sf_trt.engine_loop`) owns lanes, ticks and cancellation;
no route touches the Executor. Needs the ``serve`` extra
(``pip install -e '.[serve]'``). See ``docs/serving.md``.
"""

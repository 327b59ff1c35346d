"""``sf-trt serve``: an OpenAI-compatible HTTP server over the engine loop.

A thin shell: :mod:`.schemas` (request bodies, unknown fields refused),
:mod:`.app` (the routes and the app's lifespan), :mod:`.jobs` (a request's
job: checked once, submitted, followed, aborted), :mod:`.rendering` (OpenAI's JSON
and SSE shapes), :mod:`.errors` (error responses), :mod:`.state` (what routes
share), :mod:`.metrics` (Prometheus, vLLM's names), :mod:`.guard` (what is
refused before a body is read), :mod:`.server` (uvicorn with time limits and a
draining shutdown), :mod:`.tokenize` (``/tokenize``, ``/detokenize``),
:mod:`.limits` (the defaults of the limits) and :mod:`.proxy`; the subcommands and
the load generator live in ``cli/``.
The engine loop (:mod:`sf_trt.engine_loop`) owns lanes, ticks and cancellation;
no route touches the Executor. Needs the ``serve`` extra
(``pip install -e '.[serve]'``). See ``docs/serving.md``.
"""

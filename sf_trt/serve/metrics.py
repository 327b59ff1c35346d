"""Prometheus metrics under ``sf_trt:``, named as vLLM's ``vllm:`` ones so dashboards work.

Each server has its own registry (several servers in one process do not share
counters). The engine loop reports through :class:`ServerMetrics` (its
``LoopObserver``): tokens as they are produced, the rest when a request finishes.
"""

from __future__ import annotations

from typing import Iterable, Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ..engine_loop import Output
from ..outputs import finish_reason

__all__ = ["ServerMetrics", "PREFIX", "merge_expositions"]

PREFIX = "sf_trt:"
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class ServerMetrics:
    """The server's metrics; ``render()`` is the ``/metrics`` body."""

    def __init__(self, model_name: str, const_labels: Optional[dict[str, str]] = None) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        extra = dict(const_labels or {})
        r, label = self.registry, ["model_name", *extra]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, label + list(extra), registry=r)

        def hist(name: str, doc: str, buckets) -> Histogram:
            return Histogram(PREFIX + name, doc, label, buckets=buckets, registry=r)

        self.running = Gauge(PREFIX + "num_requests_running", "Requests in lanes (prefilling or decoding).", label, registry=r)
        self.waiting = Gauge(PREFIX + "num_requests_waiting", "Requests waiting for a lane.", label, registry=r)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests (per choice: each is prefilled).")
        self.generation_tokens = counter("generation_tokens", "Output tokens, counted as they are produced.")
        self.success = counter("request_success", "Finished requests by finish reason.", ("finished_reason",))
        self.disconnects = counter("client_disconnects", "Requests whose client went away before they finished.")
        self.ttft = hist("time_to_first_token_seconds", "Arrival to first output token.", _LATENCY_BUCKETS)
        self.tpot = hist("time_per_output_token_seconds", "Per request: (last - first token time) / (tokens - 1).", _TOKEN_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to finish.", _LATENCY_BUCKETS)
        self.drafts = counter("spec_decode_num_drafts", "Verify passes that carried a draft.")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens sent for verification.")
        self.accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens verified and emitted.")
        self.prefix_queries = counter("prefix_cache_queries", "Prefix cache queries, in prompt tokens (of finished requests, while the cache is on).")
        self.prefix_hits = counter("prefix_cache_hits", "Prefix cache hits, in prompt tokens taken from the cache.")
        self._labels = {"model_name": model_name, **extra}
        for series in (self.running, self.waiting, self.prompt_tokens, self.generation_tokens, self.disconnects,
                       self.drafts, self.draft_tokens, self.accepted_tokens, self.prefix_queries, self.prefix_hits):
            series.labels(**self._labels)  # present (at 0) from the start, so a server that served nothing shows

    # -- LoopObserver (called on the engine loop's thread) ----------------------------------------

    def on_output(self, out: Output) -> None:
        m = self._labels
        if out.tokens:
            self.generation_tokens.labels(**m).inc(len(out.tokens))
        if not out.finished:
            return
        self.success.labels(finished_reason=finish_reason(out.finish, out.error), **m).inc()
        self.prompt_tokens.labels(**m).inc(out.prompt_tokens)
        if out.finished_at is not None:
            self.e2e.labels(**m).observe(out.finished_at - out.arrival)
        if out.first_token_at is not None:
            self.ttft.labels(**m).observe(out.first_token_at - out.arrival)
            if out.completion_tokens > 1 and out.finished_at is not None:
                self.tpot.labels(**m).observe((out.finished_at - out.first_token_at) / (out.completion_tokens - 1))
        self.drafts.labels(**m).inc(out.drafts)
        self.draft_tokens.labels(**m).inc(out.proposed)
        self.accepted_tokens.labels(**m).inc(out.accepted)
        if out.cached_tokens is not None:
            self.prefix_queries.labels(**m).inc(out.prompt_tokens)
            self.prefix_hits.labels(**m).inc(out.cached_tokens)

    def on_state(self, running: int, waiting: int) -> None:
        self.running.labels(**self._labels).set(running)
        self.waiting.labels(**self._labels).set(waiting)

    # -- the server ---------------------------------------------------------------------------------

    def client_disconnected(self) -> None:
        self.disconnects.labels(**self._labels).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def merge_expositions(texts: Iterable[bytes | str]) -> bytes:
    """Several servers' ``/metrics`` bodies as one: each family once, with every server's
    samples (their label sets must differ, e.g. by a ``replica`` label)."""
    families: dict[str, object] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode() if isinstance(text, bytes) else text):
            merged = families.setdefault(family.name, family)
            if merged is not family:
                merged.samples.extend(family.samples)

    class _Merged:
        def collect(self):
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged())
    return generate_latest(registry)

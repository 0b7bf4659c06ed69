"""Prometheus metrics (prometheus-client), vLLM-compatible names under the `structserve:` prefix.

Two sources feed one registry per app (no process-global state):
- `EngineCollector` reads one `EngineStats` snapshot per scrape (gauges, token counters, the grammar
  compile histogram), so the engine's step loop only bumps plain counters.
- `ServingMetrics` owns the histograms and counters the api observes as outputs arrive
  (`api/observability/stream_tracker.py`, `api/observability/tool_call_metrics.py`): time to first token, inter-token latency,
  end-to-end latency, request_success by finish_reason, tool_calls by validity, and time to the
  first tool-call delta (a choice's first call header).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from fastapi import Request
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from engine import HistogramSnapshot
from engine import EngineStats

PREFIX = "structserve:"

# vLLM's bucket bounds (seconds), so dashboards built for vLLM read the same quantiles.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "tool_calls")
"""Label values of request_success_total present from the start: the finish_reasons a client gets
(an abort is not a success)."""


class StatsSource(Protocol):
    """Anything that can report EngineStats (the AsyncEngine)."""

    def stats(self) -> EngineStats: ...


class EngineCollector(Collector):
    """Reads one EngineStats snapshot per scrape, so the step loop does no metrics work."""

    def __init__(self, source: StatsSource, model_name: str) -> None:
        self.source = source
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        """Yield every engine gauge, counter and histogram, labelled with model_name."""
        s = self.source.stats()
        gauges = [
            ("num_requests_running", "Requests with sequences in the running batch.", s.num_requests_running),
            ("num_requests_waiting", "Requests waiting to be scheduled.", s.num_requests_waiting),
            ("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = 100%).", s.kv_cache_usage),
            ("lora_adapters_resident", "LoRA adapters loaded in GPU slots.", s.lora_adapters_resident),
        ]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            g.add_metric([self.model_name], value)
            yield g
        counters = [
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries),
            ("prefix_cache_hits", "Prompt tokens served by the prefix cache.", s.prefix_cache_hits),
            ("prompt_tokens", "Prompt tokens of requests whose prefill ran.", s.prompt_tokens),
            ("generation_tokens", "Output tokens produced (sampled or grammar-forced).", s.generation_tokens),
            ("num_preemptions", "Sequences preempted (recomputed later).", s.num_preemptions),
            ("forced_tokens", "Output tokens forced by the grammar (jump-forward, not sampled).", s.forced_tokens),
            ("grammar_closed_outputs", "Constrained outputs ended by a grammar closing before max_tokens cut them.",
             s.closed_outputs),
            ("grammar_cache_hits", "Grammar compiles served by the compile cache.", s.grammar_cache_hits),
            ("compiled_steps", "Forward passes run by the compiled decode graph.", s.compiled_steps),
            ("eager_steps", "Forward passes run by the eager model.", s.eager_steps),
        ]
        for name, doc, value in counters:
            c = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            c.add_metric([self.model_name], value)
            yield c
        yield self._histogram(
            "grammar_compile_seconds", "Seconds from submit to result of grammar compiles that missed the cache.",
            s.grammar_compile_seconds)

    def _histogram(self, name: str, doc: str, snap: HistogramSnapshot) -> HistogramMetricFamily:
        family = HistogramMetricFamily(PREFIX + name, doc, labels=["model_name"])
        cumulative, buckets = 0, []
        for bound, count in zip((*snap.upper_bounds, float("inf")), snap.bucket_counts):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric([self.model_name], buckets, sum_value=snap.sum)
        return family


class ServingMetrics:
    """The /metrics registry of one app: the engine collector plus what the api observes.

    Observations happen on the event loop as each request's outputs arrive; every value is in
    seconds. Latencies follow vLLM: each choice of a request counts as one request (as vLLM's
    fan-out of `n`), measured from the EngineRequest's `arrival_time`.
    """

    def __init__(self, source: StatsSource, model_name: str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(source, model_name))
        labels = ["model_name"]
        reg = self.registry
        self._ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time to first token in seconds.",
                               labels, registry=reg, buckets=TTFT_BUCKETS_S).labels(model_name)
        self._ttftc = Histogram(PREFIX + "time_to_first_tool_call_delta_seconds",
                                "Seconds from arrival to a choice's first tool-call delta (its first call's header).",
                                labels, registry=reg, buckets=TTFT_BUCKETS_S).labels(model_name)
        self._itl = Histogram(PREFIX + "inter_token_latency_seconds",
                              "Seconds between two outputs carrying tokens of one choice.",
                              labels, registry=reg, buckets=ITL_BUCKETS_S).labels(model_name)
        self._e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "End-to-end request latency in seconds.",
                              labels, registry=reg, buckets=E2E_BUCKETS_S).labels(model_name)
        self._success = Counter(PREFIX + "request_success", "Finished requests (choices) by finish_reason.",
                                [*labels, "finish_reason"], registry=reg)
        self._tool_calls = Counter(PREFIX + "tool_calls",
                                   "Parsed tool calls by whether their arguments validate against the tool schema.",
                                   [*labels, "validity"], registry=reg)
        for reason in FINISH_REASONS:
            self._success.labels(model_name, reason)
        for validity in ("valid", "invalid"):
            self._tool_calls.labels(model_name, validity)

    def observe_first_token(self, seconds: float) -> None:
        """A choice produced its first token `seconds` after its request arrived."""
        self._ttft.observe(seconds)

    def observe_first_tool_call_delta(self, seconds: float) -> None:
        """A choice sent its first tool-call delta `seconds` after its request arrived."""
        self._ttftc.observe(seconds)

    def observe_inter_token(self, seconds: float) -> None:
        """A choice produced more tokens `seconds` after its previous ones."""
        self._itl.observe(seconds)

    def observe_finished(self, seconds: float) -> None:
        """A choice finished in the engine `seconds` after arrival (end-to-end latency)."""
        self._e2e.observe(seconds)

    def count_success(self, finish_reason: str) -> None:
        """A choice ended with `finish_reason`, the one its client got ("stop", "length", "tool_calls")."""
        self._success.labels(self.model_name, finish_reason).inc()

    def count_tool_call(self, valid: bool) -> None:
        """One parsed tool call; `valid`: its arguments validate against the tool's schema."""
        self._tool_calls.labels(self.model_name, "valid" if valid else "invalid").inc()


def app_metrics(request: Request) -> ServingMetrics | None:
    """The ServingMetrics of the app serving `request` (set by `create_app`; None without it)."""
    metrics: ServingMetrics | None = getattr(request.app.state, "metrics", None)
    return metrics

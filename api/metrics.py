"""Prometheus metrics (prometheus-client), vLLM-compatible names under the `structserve:` prefix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.stats import EngineStats

PREFIX = "structserve:"


class StatsSource(Protocol):
    """Anything that can report EngineStats (the AsyncEngine)."""

    def stats(self) -> EngineStats: ...


class EngineCollector(Collector):
    """Reads one EngineStats snapshot per scrape, so the step loop does no metrics work."""

    def __init__(self, source: StatsSource, model_name: str) -> None:
        self.source = source
        self.model_name = model_name

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Yield every engine gauge and counter, labelled with model_name."""
        s = self.source.stats()
        gauges = [
            ("num_requests_running", "Requests with sequences in the running batch.", s.num_requests_running),
            ("num_requests_waiting", "Requests waiting to be scheduled.", s.num_requests_waiting),
            ("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = 100%).", s.kv_cache_usage),
        ]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            g.add_metric([self.model_name], value)
            yield g
        counters = [
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_cache_queries),
            ("prefix_cache_hits", "Prompt tokens served by the prefix cache.", s.prefix_cache_hits),
            ("prompt_tokens", "Prompt tokens received.", s.prompt_tokens),
            ("generation_tokens", "Tokens generated.", s.generation_tokens),
            ("num_preemptions", "Sequences preempted (recomputed later).", s.num_preemptions),
        ]
        for name, doc, value in counters:
            c = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
            c.add_metric([self.model_name], value)
            yield c


def build_registry(source: StatsSource, model_name: str) -> CollectorRegistry:
    """A fresh registry (no process-global state) holding the engine collector."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(source, model_name))
    return registry

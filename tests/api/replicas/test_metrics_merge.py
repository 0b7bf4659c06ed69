"""`merge_metrics`: every replica's samples under one family header, each with its replica label."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from api.replicas.metrics_merge import merge_metrics


def exposition(running: float, tokens: float) -> str:
    registry = CollectorRegistry()
    Gauge("structserve:num_requests_running", "running", ["model_name"], registry=registry).labels("m").set(running)
    Counter("structserve:prompt_tokens", "prompt tokens", ["model_name"], registry=registry).labels("m").inc(tokens)
    return generate_latest(registry).decode()


def test_samples_of_each_replica_keep_their_values_under_a_replica_label() -> None:
    merged = merge_metrics({0: (exposition(2, 10), "111"), 1: (exposition(5, 30), "222")}).decode()
    assert merged.count("# TYPE structserve:num_requests_running gauge") == 1
    samples = {(s.name, s.labels.get("replica")): (s.value, s.labels.get("model_name"))
               for family in text_string_to_metric_families(merged) for s in family.samples}
    assert samples[("structserve:num_requests_running", "0")] == (2.0, "m")
    assert samples[("structserve:num_requests_running", "1")] == (5.0, "m")
    assert samples[("structserve:prompt_tokens_total", "1")] == (30.0, "m")
    assert samples[("structserve:replica_process_id", "0")][0] == 111.0


def test_a_replica_that_did_not_answer_is_simply_absent() -> None:
    merged = merge_metrics({1: (exposition(1, 1), "")}).decode()
    assert 'replica="1"' in merged and 'replica="0"' not in merged and "replica_process_id{" not in merged

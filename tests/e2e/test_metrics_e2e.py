"""Issue 7 end to end: /metrics of the real server agrees with the requests sent (token counters,
latency histograms, request_success, a grammar compile, forced tokens), and each request leaves
one structured log line."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL

pytestmark = pytest.mark.slow


def scrape(url: str) -> dict[str, float]:
    """Samples of /metrics by name (labels other than model_name and finish_reason dropped)."""
    response = httpx.get(url + "/metrics", timeout=30)
    assert response.status_code == 200
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            if "le" in s.labels:
                continue
            assert s.labels.get("model_name") == MODEL
            reason = s.labels.get("finish_reason") or s.labels.get("validity")
            samples[s.name + (f"{{{reason}}}" if reason else "")] = s.value
    return samples


def test_metrics_agree_with_the_requests_sent(server) -> None:
    before = scrape(server.url)
    client = server.client()
    key = f"probe_{uuid.uuid4().hex[:8]}"       # a schema no earlier test compiled: a cache miss
    schema = {"type": "object", "properties": {key: {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": [key], "additionalProperties": False}
    request_id = f"metrics-e2e-{uuid.uuid4().hex[:8]}"
    structured = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Give a digit as JSON."}], max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "digit", "schema": schema}},
        extra_headers={"x-request-id": request_id},
    )
    assert json.loads(structured.choices[0].message.content)[key] in range(10)
    plain = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0)
    assert plain.choices[0].finish_reason == "length"
    after = scrape(server.url)

    def delta(name: str) -> float:
        return after["structserve:" + name] - before.get("structserve:" + name, 0.0)

    usages = [structured.usage, plain.usage]
    assert delta("prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert delta("generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert delta("e2e_request_latency_seconds_count") == 2
    assert delta("time_to_first_token_seconds_count") == 2
    assert delta("request_success_total{length}") == 1 and delta("request_success_total{stop}") == 1
    assert delta("grammar_compile_seconds_count") == 1
    assert delta("forced_tokens_total") > 0                   # the key's name is forced by the grammar
    assert after["structserve:num_requests_running"] == 0
    line = next(ln for ln in server.log().splitlines() if f"request_id={request_id}" in ln)
    assert "endpoint=/v1/chat/completions" in line and "status=200 outcome=ok" in line
    assert f"prompt_tokens={structured.usage.prompt_tokens} output_tokens={structured.usage.completion_tokens}" in line

"""/metrics: Prometheus text that prometheus-client's own parser reads, with the engine's values and
the api's own request metrics (latency histograms, request_success, tool_calls by validity)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, chat_body
from prometheus_client.parser import text_string_to_metric_families

from engine.request import EngineRequest

pytestmark = pytest.mark.anyio

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "parameters": TOOL["function"]["parameters"]}


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics by (name, sorted labels without model_name); asserts model_name is set."""
    response = await client.get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            assert s.labels.pop("model_name") == "fake-model"
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples[("structserve:" + name, tuple(sorted(labels.items())))]


def call_text(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def answer(engine: FakeEngine, text: str) -> None:
    def script(request: EngineRequest, index: int) -> str:
        return text

    engine.script_for = script


async def test_metrics_parse_and_carry_engine_values(client: httpx.AsyncClient) -> None:
    samples = await scrape(client)
    assert value(samples, "kv_cache_usage_perc") == 0.25
    assert value(samples, "prefix_cache_hits_total") == 32
    assert value(samples, "prefix_cache_queries_total") == 64
    assert value(samples, "lora_adapters_resident") == 0
    assert value(samples, "grammar_compile_seconds_count") == 0
    assert value(samples, "grammar_compile_seconds_bucket", le="+Inf") == 0
    for name in ("forced_tokens_total", "grammar_cache_hits_total", "num_preemptions_total"):
        assert value(samples, name) == 0


async def test_latency_histograms_and_success_count_finished_requests(client: httpx.AsyncClient) -> None:
    before = await scrape(client)
    assert value(before, "e2e_request_latency_seconds_count") == 0
    assert value(before, "request_success_total", finish_reason="length") == 0
    for stream in (False, True):
        response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=3, stream=stream))
        assert response.status_code == 200
    after = await scrape(client)
    assert value(after, "e2e_request_latency_seconds_count") == 2
    assert value(after, "time_to_first_token_seconds_count") == 2
    assert value(after, "inter_token_latency_seconds_count") == 2 * (3 - 1)   # one per later token
    assert value(after, "request_success_total", finish_reason="length") == 2
    assert value(after, "request_success_total", finish_reason="stop") == 0
    assert 0 < value(after, "e2e_request_latency_seconds_sum") < 5
    buckets = [v for (name, labels), v in after.items() if name.endswith("e2e_request_latency_seconds_bucket")]
    assert max(buckets) == 2 and min(buckets) >= 0


async def test_each_choice_and_prompt_counts_as_a_request(client: httpx.AsyncClient) -> None:
    body = {"model": "fake-model", "prompt": ["a", "b"], "n": 2, "max_tokens": 50}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    samples = await scrape(client)
    assert value(samples, "request_success_total", finish_reason="stop") == 4
    assert value(samples, "e2e_request_latency_seconds_count") == 4


async def test_failed_requests_are_not_successes(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.fail_after_tokens = 2
    response = await client.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 500
    samples = await scrape(client)
    assert value(samples, "e2e_request_latency_seconds_count") == 0
    assert value(samples, "time_to_first_token_seconds_count") == 1   # it did start
    assert value(samples, "request_success_total", finish_reason="stop") == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_chat_tool_calls_are_counted_by_validity(
    client: httpx.AsyncClient, engine: FakeEngine, stream: bool
) -> None:
    engine.max_model_len = 8192
    answer(engine, call_text("get_weather", {"city": "Oslo"}) + "\n" + call_text("get_weather", {"town": 1}))
    response = await client.post("/v1/chat/completions", json=chat_body(tools=[TOOL], stream=stream))
    assert response.status_code == 200
    samples = await scrape(client)
    assert value(samples, "tool_calls_total", validity="valid") == 1
    assert value(samples, "tool_calls_total", validity="invalid") == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_tool_calls_are_counted(client: httpx.AsyncClient, engine: FakeEngine, stream: bool) -> None:
    engine.max_model_len = 8192
    answer(engine, call_text("get_weather", {"city": "Oslo"}))
    body = {"model": "fake-model", "input": "Weather?", "tools": [RESPONSES_TOOL], "stream": stream}
    assert (await client.post("/v1/responses", json=body)).status_code == 200
    samples = await scrape(client)
    assert value(samples, "tool_calls_total", validity="valid") == 1
    assert value(samples, "tool_calls_total", validity="invalid") == 0
    assert value(samples, "request_success_total", finish_reason="tool_calls") == 1
    assert value(samples, "request_success_total", finish_reason="stop") == 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
async def test_success_counts_the_finish_reason_the_client_got(
    client: httpx.AsyncClient, engine: FakeEngine, endpoint: str, stream: bool
) -> None:
    """request_success is labelled with the decided finish_reason (api/generation/ending.py), not
    the engine's: a whole call ("tool_calls"; the engine said "stop"), and an auto call cut by
    max_tokens after its header ("length"), per choice (n=2 on chat)."""
    engine.max_model_len = 8192
    text = "Checking.\n" + call_text("get_weather", {"city": "Llanfairpwllgwyngyll"})
    answer(engine, text)
    n = 2 if endpoint == "/v1/chat/completions" else 1
    for max_tokens in (len(text) + 10, text.index("gwyngyll")):
        if endpoint == "/v1/chat/completions":
            body = chat_body(tools=[TOOL], stream=stream, max_tokens=max_tokens, n=n)
        elif endpoint == "/v1/responses":
            body = {"model": "fake-model", "input": "Weather?", "tools": [RESPONSES_TOOL], "stream": stream,
                    "max_output_tokens": max_tokens}
        else:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "Weather?"}],
                    "stream": stream, "max_tokens": max_tokens,
                    "tools": [{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}]}
        assert (await client.post(endpoint, json=body)).status_code == 200
    samples = await scrape(client)
    counts = {reason: value(samples, "request_success_total", finish_reason=reason)
              for reason in ("tool_calls", "length", "stop")}
    assert counts == {"tool_calls": n, "length": n, "stop": 0}
    assert value(samples, "e2e_request_latency_seconds_count") == 2 * n


async def test_each_app_has_its_own_registry(engine: FakeEngine) -> None:
    from api.app import create_app
    from api.config import ServerConfig

    apps = [create_app(engine, ServerConfig(sse_ping_interval_s=0)) for _ in range(2)]
    first, second = (httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://t") for a in apps)
    async with first, second:
        assert (await first.post("/v1/chat/completions", json=chat_body())).status_code == 200
        assert value(await scrape(first), "e2e_request_latency_seconds_count") == 1
        assert value(await scrape(second), "e2e_request_latency_seconds_count") == 0
    for app in apps:
        app.state.responses.store.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_time_to_first_tool_call_delta_is_observed_once_per_choice(
    client: httpx.AsyncClient, engine: FakeEngine, stream: bool
) -> None:
    engine.max_model_len = 8192
    answer(engine, call_text("get_weather", {"city": "Oslo"}) + "\n" + call_text("get_weather", {"city": "Rome"}))
    response = await client.post("/v1/chat/completions", json=chat_body(tools=[TOOL], stream=stream, n=2))
    assert response.status_code == 200
    answer(engine, "No call.")
    assert (await client.post("/v1/chat/completions", json=chat_body(tools=[TOOL], stream=stream))).status_code == 200
    samples = await scrape(client)
    assert value(samples, "time_to_first_tool_call_delta_seconds_count") == 2   # two choices, one each
    assert 0 < value(samples, "time_to_first_tool_call_delta_seconds_sum") < 60

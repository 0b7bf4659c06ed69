"""POST /v1/responses, whole answers: the response object read by the official client, fields to
the engine request, tools and text.format to grammars and output items (case 014)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, sdk_client
from fastapi import FastAPI
from responses_support import GET_TIME, GET_WEATHER, call_text, play, prompt_of

from constrained.spec import GrammarKind

pytestmark = pytest.mark.anyio

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=4096)


async def post(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/v1/responses", json={"model": "fake-model", **fields})


async def test_whole_response_parsed_by_the_sdk(app: FastAPI, engine: FakeEngine) -> None:
    async with sdk_client(app) as client:
        response = await client.responses.create(
            model="fake-model", input="Say hello.", instructions="Be brief.", metadata={"k": "v"}, user="u1"
        )
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.error is None and response.incomplete_details is None
    assert response.model == "fake-model" and response.output_text == "Hello world!"
    [message] = response.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    assert message.status == "completed"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    usage = response.usage
    assert usage.output_tokens == len("Hello world!") and usage.input_tokens == len(
        engine.requests[0].prompt_token_ids
    )
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 2 and usage.output_tokens_details.reasoning_tokens == 0
    assert response.instructions == "Be brief." and response.metadata == {"k": "v"} and response.user == "u1"
    assert response.tools == [] and response.tool_choice == "auto" and response.parallel_tool_calls is True
    assert response.store is True and response.background is False and response.created_at > 0
    prompt = prompt_of(engine)
    assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "user\nSay hello." in prompt


async def test_sampling_fields_reach_the_engine(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    r = await post(
        client, input="x", temperature=0.5, top_p=0.9, max_output_tokens=30, seed=7, stop=["world"]
    )
    assert r.status_code == 200, r.text
    params = engine.requests[0].sampling_params
    assert (params.temperature, params.top_p, params.max_tokens, params.seed, params.stop) == (
        0.5,
        0.9,
        30,
        7,
        ("world",),
    )
    body = r.json()
    assert body["output"][0]["content"][0]["text"] == "Hello " and body["temperature"] == 0.5


async def test_max_output_tokens_cut_is_incomplete(client: httpx.AsyncClient) -> None:
    """Case 014, Responses variant: a cut answer is "incomplete", never "completed"."""
    r = await post(
        client,
        input="x",
        max_output_tokens=6,
        text={"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}},
    )
    body = r.json()
    assert r.status_code == 200 and body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete" and body["usage"]["output_tokens"] == 6


async def test_nulls_mean_defaults(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    """Case 023 on /v1/responses: explicit null for optional fields is the default."""
    nulls = dict.fromkeys(
        [
            "temperature",
            "top_p",
            "max_output_tokens",
            "tools",
            "tool_choice",
            "instructions",
            "metadata",
            "store",
            "previous_response_id",
            "text",
            "stream",
            "user",
            "include",
        ]
    )
    r = await post(client, input="x", **nulls)
    assert r.status_code == 200, r.text
    assert engine.requests[0].sampling_params.max_tokens is None
    assert engine.limits.max_tokens(engine.requests[0]) == 4096 - len(engine.requests[0].prompt_token_ids)
    assert r.json()["temperature"] == 1.0


async def test_agents_sdk_request_shape_is_accepted(client: httpx.AsyncClient) -> None:
    """What openai-agents sends (CLIENTS.md): include [], strict tools, items without `type`."""
    r = await post(
        client,
        input=[{"role": "user", "content": "hi"}],
        include=[],
        instructions="sys",
        tools=[GET_WEATHER],
        max_output_tokens=50,
        temperature=0.2,
        truncation="disabled",
        parallel_tool_calls=False,
        tool_choice="auto",
        store=True,
        reasoning=None,
    )
    assert r.status_code == 200, r.text


async def test_text_format_json_schema_and_json_object(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    fmt = {"type": "json_schema", "name": "person", "schema": SCHEMA, "strict": True}
    r = await post(client, input="x", text={"format": fmt})
    assert r.status_code == 200, r.text
    spec = engine.requests[0].grammar_spec
    assert spec.kind is GrammarKind.JSON_SCHEMA and json.loads(spec.source) == SCHEMA
    assert r.json()["text"]["format"] == {**fmt, "description": None}
    r = await post(client, input="x", text={"format": {"type": "json_object"}})
    assert r.status_code == 200 and engine.requests[1].grammar_spec.kind is GrammarKind.JSON_OBJECT
    r = await post(client, input="x", text={"format": {"type": "text"}, "verbosity": "low"})
    assert r.status_code == 200 and engine.requests[2].grammar_spec is None


async def test_malformed_schema_is_400_naming_text_format(client: httpx.AsyncClient) -> None:
    fmt = {"type": "json_schema", "name": "p", "schema": {"type": "object", "properties": {"a": {"type": 5}}}}
    r = await post(client, input="x", text={"format": fmt})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("text.format.schema")
    r = await post(client, input="x", text={"format": {"type": "json_schema", "name": "p"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "text.format.schema"


async def test_required_tool_call_becomes_function_call_item(app: FastAPI, engine: FakeEngine) -> None:
    play(engine, call_text("get_weather", {"city": "Paris"}))
    async with sdk_client(app) as client:
        response = await client.responses.create(
            model="fake-model", input="Weather?", tools=[GET_WEATHER, GET_TIME], tool_choice="required"
        )
    assert engine.requests[0].grammar_spec is not None  # the call is forced by a grammar
    [call] = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert response.status == "completed" and response.output_text == ""
    assert response.tool_choice == "required" and [t.name for t in response.tools] == [
        "get_weather",
        "get_time",
    ]
    assert response.tools[0].strict is True and "get_weather" in prompt_of(engine)


async def test_text_around_a_call_gives_items_in_order(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    play(engine, "Let me check.\n" + call_text("get_time", {}) + "\nDone.")
    body = (await post(client, input="x", tools=[GET_TIME])).json()
    kinds = [(item["type"], item.get("name") or item["content"][0]["text"]) for item in body["output"]]
    assert kinds == [("message", "Let me check."), ("function_call", "get_time"), ("message", "Done.")]


async def test_named_tool_choice_and_none(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    play(engine, call_text("get_time", {}))
    r = await post(
        client, input="x", tools=[GET_WEATHER, GET_TIME], tool_choice={"type": "function", "name": "get_time"}
    )
    assert r.status_code == 200 and r.json()["output"][0]["name"] == "get_time"
    assert r.json()["tool_choice"] == {"type": "function", "name": "get_time"}
    r = await post(client, input="x", tools=[GET_WEATHER], tool_choice={"type": "function", "name": "nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = await post(client, input="x", tools=[GET_WEATHER], tool_choice="none")
    assert r.status_code == 200 and r.json()["output"][0]["type"] == "message"  # not parsed for calls
    assert "get_weather" not in prompt_of(engine)


async def test_forced_call_with_a_format_is_a_conflict(client: httpx.AsyncClient) -> None:
    r = await post(
        client,
        input="x",
        tools=[GET_WEATHER],
        tool_choice="required",
        text={"format": {"type": "json_object"}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "text"

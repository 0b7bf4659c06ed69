"""Tools on /v1/messages: tool_use blocks (ids, input objects, stop_reason), their stream events,
and parity with chat: the same tools and tool_choice give the same prompt and the same grammar."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from partial_json_parser import Allow
from partial_json_parser import loads as partial_json_loads
from api_support import FakeEngine
from test_messages import body, typed_events

from engine.request import EngineRequest

pytestmark = pytest.mark.anyio

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"name": "get_weather", "description": "Weather of a city.", "input_schema": WEATHER_SCHEMA},
    {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
]
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                      "parameters": WEATHER_SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


def call_text(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def tool_body(**fields: Any) -> dict[str, Any]:
    """A Messages request with room for a call (the fake tokenizer has one token per byte)."""
    return body(max_tokens=512, **fields)


def play(engine: FakeEngine, text: str) -> None:
    def script(request: EngineRequest, index: int) -> str:
        return text

    engine.script_for = script


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=8192)


async def test_forced_call_is_a_tool_use_block(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    play(engine, call_text("get_weather", {"city": "Paris"}))
    response = await client.post("/v1/messages", json=tool_body(tools=TOOLS, tool_choice={"type": "any"}))
    message = response.json()
    assert response.status_code == 200, response.text
    (block,) = message["content"]
    assert block["type"] == "tool_use" and block["id"].startswith("toolu_") and block["name"] == "get_weather"
    assert block["input"] == {"city": "Paris"}
    jsonschema.validate(block["input"], WEATHER_SCHEMA)
    assert message["stop_reason"] == "tool_use"
    assert engine.requests[-1].grammar_spec is not None


async def test_text_then_calls_stream(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    play(engine, "Let me check.\n" + call_text("get_weather", {"city": "Oslo"}) + "\n"
         + call_text("get_time", {}))
    whole = (await client.post("/v1/messages", json=tool_body(tools=TOOLS))).json()
    assert [b["type"] for b in whole["content"]] == ["text", "tool_use", "tool_use"]
    assert whole["content"][0]["text"].strip() == "Let me check."
    assert [b["input"] for b in whole["content"][1:]] == [{"city": "Oslo"}, {}]
    events = typed_events((await client.post("/v1/messages", json=tool_body(tools=TOOLS, stream=True))).text)
    starts = [d for n, d in events if n == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use", "tool_use"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert starts[1]["content_block"]["input"] == {} and starts[1]["content_block"]["name"] == "get_weather"
    assert [d["index"] for n, d in events if n == "content_block_stop"] == [0, 1, 2]
    fragments: dict[int, str] = {}
    for name, data in events:
        if name == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            fragments[data["index"]] = fragments.get(data["index"], "") + data["delta"]["partial_json"]
    assert {i: json.loads(f) for i, f in fragments.items()} == {1: {"city": "Oslo"}, 2: {}}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    # each block opens after the previous one closed
    order = [(n, d.get("index")) for n, d in events if n in ("content_block_start", "content_block_stop")]
    assert order == [("content_block_start", 0), ("content_block_stop", 0), ("content_block_start", 1),
                     ("content_block_stop", 1), ("content_block_start", 2), ("content_block_stop", 2)]


@pytest.mark.parametrize(
    ("tool_choice", "chat_fields"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "any", "disable_parallel_tool_use": True}, {"tool_choice": "required",
                                                              "parallel_tool_calls": False}),
        ({"type": "tool", "name": "get_time"}, {"tool_choice": {"type": "function",
                                                                "function": {"name": "get_time"}}}),
        ({"type": "none"}, {"tool_choice": "none"}),
    ],
)
async def test_same_prompt_and_grammar_as_chat(
    client: httpx.AsyncClient, engine: FakeEngine, tool_choice: dict[str, Any], chat_fields: dict[str, Any]
) -> None:
    messages = [{"role": "user", "content": "Weather in Rome?"}]
    response = await client.post("/v1/messages", json=tool_body(messages=messages, tools=TOOLS,
                                                           tool_choice=tool_choice))
    assert response.status_code == 200, response.text
    chat = {"model": "fake-model", "max_tokens": 512, "messages": messages, "tools": CHAT_TOOLS, **chat_fields}
    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
    ours, theirs = engine.requests[-2], engine.requests[-1]
    assert ours.prompt_token_ids == theirs.prompt_token_ids
    assert ours.grammar_spec == theirs.grammar_spec
    # auto constrains a call only once the model opens one: a grammar too (--constrain-auto-tools)
    assert (ours.grammar_spec is None) == (tool_choice["type"] == "none")


async def test_unknown_named_tool(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/messages", json=tool_body(tools=TOOLS, tool_choice={"type": "tool",
                                                                                      "name": "nope"}))
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    assert "nope" in response.json()["error"]["message"]


async def test_malformed_input_schema(client: httpx.AsyncClient) -> None:
    tools = [{"name": "bad", "input_schema": {"type": "object", "properties": {"x": {"type": 7}}}}]
    response = await client.post("/v1/messages", json=tool_body(tools=tools, tool_choice={"type": "any"}))
    assert response.status_code == 400 and response.json()["type"] == "error"


async def test_output_format_json_schema(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    play(engine, '{"name": "Ada"}')
    fields = {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    message = (await client.post("/v1/messages", json=tool_body(**fields))).json()
    assert json.loads(message["content"][0]["text"]) == {"name": "Ada"}
    chat_format = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    chat = {"model": "fake-model", "max_tokens": 512, "messages": body()["messages"], "response_format": chat_format}
    await client.post("/v1/chat/completions", json=chat)
    assert engine.requests[-2].grammar_spec == engine.requests[-1].grammar_spec
    assert engine.requests[-1].grammar_spec is not None


async def test_input_json_streams_in_fragments_that_parse_as_partial_json(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """Issue 14: input_json_delta fragments as generated; every prefix parses (the SDK parses each)."""
    city = "Llanfairpwllgwyngyll \\u00e9 " * 4
    play(engine, call_text("get_weather", {"city": city}))
    events = typed_events((await client.post("/v1/messages", json=tool_body(tools=TOOLS, stream=True))).text)
    fragments = [d["delta"]["partial_json"] for n, d in events
                 if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"]
    assert len(fragments) > 10
    for size in range(1, len(fragments)):
        assert isinstance(partial_json_loads("".join(fragments[:size]), Allow.ALL), dict)
    assert json.loads("".join(fragments)) == {"city": city}
    whole = (await client.post("/v1/messages", json=tool_body(tools=TOOLS))).json()
    assert whole["content"][0]["input"] == {"city": city}


async def test_malformed_input_keeps_its_parsed_prefix_and_the_rest_is_text(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """Unconstrained only: the call's header went out, its arguments then broke: the tool_use input
    is what the sent prefix parses to, the model's rest is a text block; streamed equals whole."""
    play(engine, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": }}\n</tool_call>')
    whole = (await client.post("/v1/messages", json=tool_body(tools=TOOLS))).json()
    assert [(b["type"], b.get("input"), b.get("text")) for b in whole["content"]] == [
        ("tool_use", {"city": "Oslo"}, None), ("text", None, "}")]
    events = typed_events((await client.post("/v1/messages", json=tool_body(tools=TOOLS, stream=True))).text)
    fragments = "".join(d["delta"]["partial_json"] for n, d in events
                        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    texts = "".join(d["delta"]["text"] for n, d in events
                    if n == "content_block_delta" and d["delta"]["type"] == "text_delta")
    assert partial_json_loads(fragments, Allow.ALL) == {"city": "Oslo"} and texts == "}"


async def test_forced_call_cut_by_max_tokens_is_stopped_and_left_out(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """tool_choice any: its block started and its first fragments streamed; the cut stops the block
    and the message, whole and streamed, leaves it out (call markup is never text)."""
    text = call_text("get_weather", {"city": "Llanfairpwllgwyngyll"})
    play(engine, text)
    fields = {"tools": TOOLS, "tool_choice": {"type": "any"}, "max_tokens": text.index("gwyngyll")}
    events = typed_events((await client.post("/v1/messages", json=body(stream=True, **fields))).text)
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["tool_use"] and [d["index"] for n, d in events if n == "content_block_stop"] == [0]
    assert sum(n == "content_block_delta" and d["delta"]["type"] == "input_json_delta" for n, d in events) > 1
    assert not any(n == "content_block_delta" and d["delta"]["type"] == "text_delta" for n, d in events)
    whole = (await client.post("/v1/messages", json=body(**fields))).json()
    assert whole["content"] == [] and whole["stop_reason"] == "max_tokens"
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"


async def test_auto_call_cut_by_max_tokens_keeps_its_block(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """tool_choice auto, unconstrained: a call whose block started stays a tool_use block (its text
    is never dropped nor moved); its input is what the streamed prefix parses to ({}: the city
    string was still open, as the SDK parses it), stop_reason "max_tokens"; stream equals whole."""
    text = "Checking.\n" + call_text("get_weather", {"city": "Llanfairpwllgwyngyll"})
    play(engine, text)
    fields = {"tools": TOOLS, "max_tokens": text.index("gwyngyll")}
    events = typed_events((await client.post("/v1/messages", json=body(stream=True, **fields))).text)
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    assert starts == ["text", "tool_use"] and [d["index"] for n, d in events if n == "content_block_stop"] == [0, 1]
    fragments = "".join(d["delta"]["partial_json"] for n, d in events
                        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    assert fragments == '{"city": "Llanfairpwll'
    whole = (await client.post("/v1/messages", json=body(**fields))).json()
    assert [(b["type"], b.get("text"), b.get("input")) for b in whole["content"]] == [
        ("text", "Checking.", None), ("tool_use", None, {})]
    assert whole["stop_reason"] == "max_tokens" and events[-2][1]["delta"]["stop_reason"] == "max_tokens"

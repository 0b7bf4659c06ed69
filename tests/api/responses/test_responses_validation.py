"""POST /v1/responses validation: input items (case 022), tool types, tool_choice, unknown and null
fields, malformed bodies (case 023); every refusal is a 400/404 with the error object and nothing
reaches the engine."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_support import FakeEngine
from responses_support import GET_TIME, GET_WEATHER, prompt_of

from api.responses.protocol.request import ResponsesRequest
from api.responses.translate import conversation as build_conversation

pytestmark = pytest.mark.anyio


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=4096)


async def post(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/v1/responses", json={"model": "fake-model", **fields})


@pytest.mark.parametrize(
    "tool_type",
    [
        "web_search",
        "web_search_preview",
        "file_search",
        "computer_use_preview",
        "mcp",
        "code_interpreter",
        "image_generation",
        "local_shell",
        "custom",
    ],
)
async def test_unsupported_tool_types_are_400(
    client: httpx.AsyncClient, engine: FakeEngine, tool_type: str
) -> None:
    r = await post(client, input="x", tools=[GET_WEATHER, {"type": tool_type, "server_label": "s"}])
    error = r.json()["error"]
    assert r.status_code == 400 and error["type"] == "invalid_request_error"
    assert (
        error["param"] == "tools[1].type"
        and tool_type in error["message"]
        and error["code"] == "not_supported"
    )
    assert engine.requests == []


async def test_unsupported_tool_choice_and_unknown_fields_are_400(client: httpx.AsyncClient) -> None:
    r = await post(client, input="x", tools=[GET_WEATHER], tool_choice={"type": "web_search_preview"})
    assert r.status_code == 400 and "web_search_preview" in r.json()["error"]["message"]
    r = await post(client, input="x", foo=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "foo"
    for field, value in [
        ("conversation", "conv_1"),
        ("prompt", {"id": "p"}),
        ("max_tool_calls", 2),
    ]:
        r = await post(client, input="x", **{field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)


@pytest.mark.parametrize(
    ("input_value", "param", "words"),
    [
        (
            [{"type": "item_reference", "id": "msg_0001"}, {"role": "user", "content": "Hi"}],
            "input[0].type",
            "item_reference",
        ),
        (
            [{"type": "computer_call_output", "call_id": "c", "output": {}}],
            "input[0].type",
            "computer_call_output",
        ),
        ([{"type": "mcp_call", "id": "m"}], "input[0].type", "mcp_call"),
        ([{"type": "reasoning", "id": "r", "summary": []}], "input[0].type", "reasoning"),
        ([{"type": "function_call_output", "output": "x"}], "input[0].call_id", "call_id"),
        ([{"role": "tool", "content": "x"}], "input[0].role", "role"),
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}],
            "input[0].content[0].type",
            "input_image",
        ),
        ([{"content": "no role or type"}], "input[0]", "type"),
        (42, "input", "input"),
    ],
)
async def test_bad_input_items_are_400(
    client: httpx.AsyncClient, engine: FakeEngine, input_value: Any, param: str, words: str
) -> None:
    """Case 022: unsupported items are 400 naming them, never 500, never a bare key name."""
    r = await post(client, input=input_value)
    error = r.json()["error"]
    assert r.status_code == 400 and error["type"] == "invalid_request_error", r.text
    assert error["param"] == param and words in error["message"] and len(error["message"]) > 20
    assert engine.requests == []


async def test_good_input_items_are_200(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    items = [
        {"role": "system", "content": "sys"},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
    ]
    r = await post(client, input=items, tools=[GET_TIME])
    assert r.status_code == 200, r.text
    prompt = prompt_of(engine)
    for text in ("system\nsys", "system\ndev", "user\na\nb", "assistant\nok", "tool\n12:00"):
        assert text in prompt


async def test_function_call_output_needs_a_known_call(client: httpx.AsyncClient) -> None:
    r = await post(client, input=[{"type": "function_call_output", "call_id": "call_x", "output": "1"}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].call_id"
    assert "call_x" in r.json()["error"]["message"]


def test_function_calls_join_the_assistant_message_before_them() -> None:
    body = ResponsesRequest.model_validate(
        {
            "input": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "checking"},
                {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "b", "arguments": '{"x": 1}'},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [{"type": "input_text", "text": "r1"}],
                },
                {"type": "function_call_output", "call_id": "c2", "output": "r2"},
            ]
        }
    )
    messages, input_items = build_conversation(body, [])
    _, assistant, out1, out2 = messages
    assert assistant.role == "assistant" and assistant.content == "checking"
    assert [(c.id, c.name) for c in assistant.tool_calls] == [("c1", "a"), ("c2", "b")]
    assert out1.role == "tool" and (out1.tool_call_id, out1.content) == ("c1", "r1")
    assert out2.role == "tool" and out2.content == "r2"
    stored = [item.model_dump() for item in input_items]
    assert [item["type"] for item in stored] == ["message"] * 2 + ["function_call"] * 2 + [
        "function_call_output"
    ] * 2
    assert stored[0]["content"] == [{"type": "input_text", "text": "q"}] and stored[0]["id"].startswith(
        "msg_"
    )
    assert stored[1]["content"][0]["type"] == "output_text" and stored[4]["id"].startswith("fco_")


async def test_bad_bodies_are_400(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/responses", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    for fields, param in [
        ({}, "input"),
        ({"input": "x", "temperature": 2.5}, "temperature"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "top_p": 1.5}, "top_p"),
        ({"input": "x", "model": "other"}, "model"),
    ]:
        r = await post(client, **fields)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, (fields, r.text)
    r = await post(client, input="x", background=True, stream=True)
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
    r = await post(client, input="x", background=True, store=False)
    assert r.status_code == 400 and r.json()["error"]["param"] == "store"


async def test_context_too_long_names_input(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    """Also in the background: the engine refuses it before it is queued, so the client gets the
    400, not a queued response that fails later."""
    for background in (False, True):
        r = await post(client, input="x" * 5000, background=background)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert r.json()["error"]["param"] == "input"
    r = await post(client, input="x" * 5000, background=True, max_output_tokens=5)
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "4096" in message and "5 for max_tokens" in message, message
    assert engine.requests == []


async def test_malformed_tool_schema_names_the_tool(client: httpx.AsyncClient) -> None:
    bad = {**GET_WEATHER, "parameters": {"type": "object", "properties": {"city": {"type": 3}}}}
    r = await post(client, input="x", tools=[GET_TIME, bad])
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("tools[1].parameters"), r.text

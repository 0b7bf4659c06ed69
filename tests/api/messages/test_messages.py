"""/v1/messages and /v1/messages/count_tokens over raw HTTP on the fake engine: the message
object, the exact stream event order and record format, stop reasons, usage, the prompt the
conversation renders to, and Anthropic's error bodies."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from api_support import FakeEngine

pytestmark = pytest.mark.anyio


def body(**fields: Any) -> dict[str, Any]:
    """A minimal valid Messages request with `fields` added."""
    return {"model": "fake-model", "max_tokens": 64, "messages": [{"role": "user", "content": "Say hello."}],
            **fields}


def typed_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a typed SSE body, checking the framing: every record is one
    `event: <name>` line and one `data: <json>` line whose `type` is the name."""
    assert text.endswith("\n\n"), repr(text[-20:])
    events = []
    for record in text.split("\n\n")[:-1]:
        lines = [line for line in record.split("\n") if not line.startswith(":")]
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), record
        name, data = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert data["type"] == name
        events.append((name, data))
    return events


def prompt_text(engine: FakeEngine) -> str:
    return engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)


async def test_whole_message(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await client.post("/v1/messages", json=body())
    assert response.status_code == 200
    message = response.json()
    assert message["id"].startswith("msg_") and message["type"] == "message" and message["role"] == "assistant"
    assert message["model"] == "fake-model"
    assert message["content"] == [{"type": "text", "text": "Hello world!"}]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None
    # the fake engine serves 2 prompt tokens from the prefix cache
    num_prompt_tokens = len(engine.requests[-1].prompt_token_ids)
    assert message["usage"] == {"input_tokens": num_prompt_tokens - 2, "output_tokens": 12, "cache_read_input_tokens": 2,
                                "cache_creation_input_tokens": 0}


async def test_stream_event_order(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await client.post("/v1/messages", json=body(stream=True))
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = typed_events(response.text)
    names = [name for name, _ in events]
    num_deltas = len("Hello world!")
    assert names == ["message_start", "content_block_start", "ping", *["content_block_delta"] * num_deltas,
                     "content_block_stop", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == len(engine.requests[-1].prompt_token_ids) - 2 and start["usage"]["output_tokens"] == 0
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    assert text == "Hello world!"
    assert {data["delta"]["type"] for name, data in events if name == "content_block_delta"} == {"text_delta"}
    assert events[-3][1] == {"type": "content_block_stop", "index": 0}
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == 12


async def test_stream_equals_whole(client: httpx.AsyncClient) -> None:
    whole = (await client.post("/v1/messages", json=body())).json()
    events = typed_events((await client.post("/v1/messages", json=body(stream=True))).text)
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert [{"type": "text", "text": text}] == whole["content"]
    assert events[-2][1]["delta"]["stop_reason"] == whole["stop_reason"]
    assert events[-2][1]["usage"] == whole["usage"]


async def test_stop_sequence_reported(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    message = (await client.post("/v1/messages", json=body(stop_sequences=["xyz", "wor"]))).json()
    assert message["content"] == [{"type": "text", "text": "Hello "}]
    assert message["stop_reason"] == "stop_sequence" and message["stop_sequence"] == "wor"
    assert engine.requests[-1].sampling_params.stop == ("xyz", "wor")


async def test_max_tokens(client: httpx.AsyncClient) -> None:
    message = (await client.post("/v1/messages", json=body(max_tokens=5))).json()
    assert message["content"][0]["text"] == "Hello" and message["stop_reason"] == "max_tokens"
    assert message["usage"]["output_tokens"] == 5


async def test_sampling_fields(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    await client.post("/v1/messages", json=body(temperature=0.0, top_p=0.5, top_k=7, metadata={"user_id": "u"}))
    params = engine.requests[-1].sampling_params
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.0, 0.5, 7, 64)


async def test_conversation_rendering(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "text", "text": "In Paris."}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": True},
            {"type": "text", "text": "Thanks."},
        ]},
    ]
    system = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]
    response = await client.post("/v1/messages", json=body(system=system, messages=messages))
    assert response.status_code == 200, response.text
    assert prompt_text(engine) == (
        "<|im_start|>system\nBe brief.\nBe kind.<|im_end|>\n"
        "<|im_start|>user\nWeather?\nIn Paris.<|im_end|>\n"
        "<|im_start|>assistant\nChecking.<|im_end|>\n"
        "<|im_start|>tool\nsunny<|im_end|>\n"
        "<|im_start|>tool\nError: boom<|im_end|>\n"
        "<|im_start|>user\nThanks.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


async def test_count_tokens_equals_usage(client: httpx.AsyncClient) -> None:
    request = body(system="Be brief.", messages=[{"role": "user", "content": "Count me."}])
    usage = (await client.post("/v1/messages", json=request)).json()["usage"]
    del request["max_tokens"]
    counted = await client.post("/v1/messages/count_tokens", json=request)
    assert counted.status_code == 200 and counted.json() == {
        "input_tokens": usage["input_tokens"] + usage["cache_read_input_tokens"]
        + usage["cache_creation_input_tokens"]
    }


async def test_count_tokens_rejects_generation_fields(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/messages/count_tokens", json=body())
    assert response.status_code == 400
    assert response.json()["error"] == {"type": "invalid_request_error",
                                        "message": "Unrecognized request argument supplied: max_tokens"}


def assert_anthropic_error(response: httpx.Response, status: int, error_type: str, *words: str) -> None:
    assert response.status_code == status, response.text
    data = response.json()
    assert set(data) == {"type", "error"} and data["type"] == "error"
    assert set(data["error"]) == {"type", "message"} and data["error"]["type"] == error_type
    for word in words:
        assert word in data["error"]["message"]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"unknown_field": 1}, ["unknown_field"]),
        ({"max_tokens": 0}, ["max_tokens"]),
        ({"temperature": 1.5}, ["temperature"]),
        ({"messages": []}, ["messages"]),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
         ["image", "not supported"]),
        ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
         ["document", "not supported"]),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, ["web_search_20250305"]),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, ["thinking"]),
        ({"tool_choice": {"type": "any"}}, ["tool_choice"]),
        ({"stop_sequences": [""]}, ["stop_sequences"]),
        ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f",
                                                     "input": {}}]}]}, ["tool_use", "user turn"]),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]}, ["tool_result", "assistant"]),
    ],
)
async def test_invalid_requests(client: httpx.AsyncClient, fields: dict[str, Any], words: list[str]) -> None:
    assert_anthropic_error(await client.post("/v1/messages", json=body(**fields)), 400, "invalid_request_error",
                           *words)


async def test_missing_max_tokens(client: httpx.AsyncClient) -> None:
    request = body()
    del request["max_tokens"]
    assert_anthropic_error(await client.post("/v1/messages", json=request), 400, "invalid_request_error",
                           "max_tokens")


async def test_not_found_errors(client: httpx.AsyncClient) -> None:
    assert_anthropic_error(await client.post("/v1/messages", json=body(model="nope")), 404, "not_found_error",
                           "nope")
    assert_anthropic_error(await client.post("/v1/messages/batches", json={}), 404, "not_found_error")
    # the OpenAI routes keep OpenAI's body
    assert "error" in (await client.post("/v1/nothing", json={})).json()


async def test_overloaded_is_529(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.overloaded = True
    response = await client.post("/v1/messages", json=body())
    assert_anthropic_error(response, 529, "overloaded_error", "overloaded")
    assert response.headers["retry-after"] == "1"
    assert (await client.post("/v1/chat/completions", json={"model": "fake-model", "messages": [
        {"role": "user", "content": "x"}]})).status_code == 429


async def test_failure_after_start_is_an_error_event(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.fail_after_tokens = 3
    events = typed_events((await client.post("/v1/messages", json=body(stream=True))).text)
    assert [name for name, _ in events][:3] == ["message_start", "content_block_start", "ping"]
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error",
                                                                "message": "internal server error"}})
    assert "message_stop" not in [name for name, _ in events]


async def test_context_too_long(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/messages", json=body(max_tokens=100000))
    assert_anthropic_error(response, 400, "invalid_request_error", "maximum context length")

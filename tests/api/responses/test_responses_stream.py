"""POST /v1/responses with stream: true: SSE framing, the event lifecycle of every item (case 020),
tool calls as function_call events, truncation, failures, and stream == whole."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, sdk_client
from fastapi import FastAPI
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseOutputItemAddedEvent,
    ResponseTextDeltaEvent,
)
from responses_support import (
    GET_TIME,
    GET_WEATHER,
    call_text,
    check_lifecycle,
    play,
    typed_events,
    without_ids,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=4096)


async def stream(client: httpx.AsyncClient, **fields: Any) -> list[dict[str, Any]]:
    r = await client.post("/v1/responses", json={"model": "fake-model", "stream": True, **fields})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    assert "[DONE]" not in r.text
    return typed_events(r.text)


async def whole(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    r = await client.post("/v1/responses", json={"model": "fake-model", **fields})
    assert r.status_code == 200, r.text
    return r.json()


async def test_text_stream_event_order(client: httpx.AsyncClient) -> None:
    events = await stream(client, input="x")
    response = check_lifecycle(events)
    types = [e["type"] for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[4:-4] == ["response.output_text.delta"] * len("Hello world!")
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert response["status"] == "completed" and response["usage"]["output_tokens"] == 12
    assert all(e["logprobs"] == [] for e in events if e["type"] == "response.output_text.delta")
    assert events[2]["item"]["status"] == "in_progress" and events[2]["item"]["content"] == []


async def test_sdk_parses_every_event(app: FastAPI, engine: FakeEngine) -> None:
    play(engine, "Sure.\n" + call_text("get_weather", {"city": "Paris"}))
    async with sdk_client(app) as client:
        events = [
            e
            async for e in await client.responses.create(
                model="fake-model", input="x", tools=[GET_WEATHER], stream=True
            )
        ]
    assert isinstance(events[0], ResponseCreatedEvent) and isinstance(events[-1], ResponseCompletedEvent)
    assert any(isinstance(e, ResponseTextDeltaEvent) for e in events)
    added = [e for e in events if isinstance(e, ResponseOutputItemAddedEvent)]
    assert [e.item.type for e in added] == ["message", "function_call"]
    [done] = [e for e in events if isinstance(e, ResponseFunctionCallArgumentsDoneEvent)]
    assert json.loads(done.arguments) == {"city": "Paris"} and done.item_id == added[1].item.id
    assert events[-1].response.output[1].call_id == added[1].item.call_id
    assert [e.sequence_number for e in events] == list(range(len(events)))


async def test_sdk_stream_helper_accumulates(app: FastAPI, engine: FakeEngine) -> None:
    async with sdk_client(app) as client, client.responses.stream(model="fake-model", input="x") as events:
        async for _ in events:
            pass
        final = await events.get_final_response()
    assert final.output_text == "Hello world!" and final.status == "completed"


@pytest.mark.parametrize(
    "script",
    [
        call_text("get_weather", {"city": "Zürich ☃"}),
        call_text("get_weather", {"city": "A"}) + "\n" + call_text("get_time", {}),
        "Let me check.\n" + call_text("get_time", {}) + "\nDone.",
        "No call here.",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
    ],
)
async def test_stream_equals_whole(client: httpx.AsyncClient, engine: FakeEngine, script: str) -> None:
    """Case 020: the terminal output equals the items' done events and the stream=false output."""
    play(engine, script)
    fields = {"input": "x", "tools": [GET_WEATHER, GET_TIME], "temperature": 0}
    response = check_lifecycle(await stream(client, **fields))
    assert without_ids(response["output"]) == without_ids((await whole(client, **fields))["output"])


async def test_required_call_items_complete_even_without_text(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    play(engine, call_text("get_weather", {"city": "Paris"}))
    events = await stream(client, input="x", tools=[GET_WEATHER], tool_choice="required")
    response = check_lifecycle(events)
    types = [e["type"] for e in events]
    num_deltas = types.count("response.function_call_arguments.delta")
    assert num_deltas > 1   # the arguments stream as generated
    assert types[2:] == [
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * num_deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert json.loads(events[-3]["arguments"]) == {"city": "Paris"}
    added = events[2]["item"]
    assert added["type"] == "function_call" and added["name"] == "get_weather" and added["arguments"] == ""
    assert added["status"] == "in_progress" and added["call_id"].startswith("call_")
    assert (
        response["output"][0]["status"] == "completed" and events[-2]["item"]["call_id"] == added["call_id"]
    )


async def test_empty_output_still_has_one_item(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    play(engine, "")
    events = await stream(client, input="x")
    response = check_lifecycle(events)
    assert [e["type"] for e in events[2:]] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert response["output"][0]["content"][0]["text"] == ""


async def test_cut_stream_ends_incomplete(client: httpx.AsyncClient) -> None:
    events = await stream(client, input="x", max_output_tokens=5)
    response = check_lifecycle(events)
    assert events[-1]["type"] == "response.incomplete" and response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["content"][0]["text"] == "Hello"


async def test_failure_mid_stream_is_error_then_failed(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.fail_after_tokens = 3
    events = await stream(client, input="x")
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    response = check_lifecycle(events)
    assert response["status"] == "failed" and response["error"]["code"] == "server_error"
    assert response["error"]["message"] == "internal server error"  # never a raw exception text
    [message] = response["output"]  # the item opened before the failure is closed, incomplete
    assert message["status"] == "incomplete" and message["content"][0]["text"] == "Hel"
    stored = (await client.get(f"/v1/responses/{response['id']}")).json()
    assert stored["status"] == "failed"


async def test_errors_before_the_stream_are_http_errors(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/responses", json={"input": "x" * 5000, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


async def test_output_text_logprobs_stream_equals_whole(client: httpx.AsyncClient,
                                                        engine: FakeEngine) -> None:
    """include message.output_text.logprobs: every delta carries its tokens' entries, their tokens
    join to the text, and the part lists them all, streamed and whole; top_logprobs sets the
    alternatives and is echoed."""
    fields = {"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 1}
    events = await stream(client, **fields)
    assert engine.requests[-1].sampling_params.logprobs == 1
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert all("".join(lp["token"] for lp in e["logprobs"]) == e["delta"] for e in deltas)
    streamed = [lp for e in deltas for lp in e["logprobs"]]
    [done] = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["logprobs"] == streamed and len(streamed) == len("Hello world!")
    assert all(len(lp["top_logprobs"]) == 1 for lp in streamed)
    body = await whole(client, **fields)
    assert body["top_logprobs"] == 1
    assert body["output"][0]["content"][0]["logprobs"] == streamed
    plain = await whole(client, input="x")
    assert engine.requests[-1].sampling_params.logprobs is None
    assert plain["output"][0]["content"][0]["logprobs"] == []


async def test_output_text_logprobs_with_a_call_cover_the_text_only(client: httpx.AsyncClient,
                                                                  engine: FakeEngine) -> None:
    """As in chat: the message's logprobs are its text's tokens; the call's markup has none."""
    play(engine, "Sure.\n" + call_text("get_weather", {"city": "Paris"}))
    fields = {"input": "x", "tools": [GET_WEATHER], "include": ["message.output_text.logprobs"]}
    streamed = [e["item"] for e in await stream(client, **fields) if e["type"] == "response.output_item.done"]
    for output in ((await whole(client, **fields))["output"], streamed):
        message, call = output
        assert call["type"] == "function_call" and call["name"] == "get_weather"
        part = message["content"][0]
        assert part["text"].strip() == "Sure."
        assert "".join(lp["token"] for lp in part["logprobs"]) == part["text"]


async def test_forced_call_cut_by_max_output_tokens_is_closed_incomplete_and_left_out(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """tool_choice required: its header and first fragments streamed; the cut closes the item (done
    events, status "incomplete") and the response's output, whole and streamed, leaves it out (an
    output with no item gets its one empty message)."""
    text = call_text("get_weather", {"city": "Llanfairpwllgwyngyll"})
    play(engine, text)
    fields = {"input": "x", "tools": [GET_WEATHER], "tool_choice": "required",
              "max_output_tokens": text.index("gwyngyll")}
    events = await stream(client, **fields)
    types = [e["type"] for e in events]
    assert types.count("response.function_call_arguments.delta") > 1
    [done] = [e for e in events if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"]
    assert done["item"]["status"] == "incomplete"
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    assert [(i["type"], i["content"][0]["text"]) for i in final["output"]] == [("message", "")]
    assert without_ids(final["output"]) == without_ids((await whole(client, **fields))["output"])


async def test_auto_call_cut_by_max_output_tokens_stays_a_call(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """tool_choice auto, unconstrained: a call whose header streamed stays in the output, its
    arguments the model's text verbatim (not JSON) and its item status "incomplete" (its
    output_item.done event, the final and the stored response); the response is "incomplete";
    stream == whole."""
    text = "Checking.\n" + call_text("get_weather", {"city": "Llanfairpwllgwyngyll"})
    play(engine, text)
    fields = {"input": "x", "tools": [GET_WEATHER], "max_output_tokens": text.index("gwyngyll")}
    events = await stream(client, **fields)
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.incomplete"
    assert [(i["type"], i.get("arguments"), i["status"]) for i in final["output"]] == [
        ("message", None, "completed"), ("function_call", '{"city": "Llanfairpwll', "incomplete")]
    assert [e["item"]["status"] for e in events if e["type"] == "response.output_item.done"] == [
        "completed", "incomplete"]
    assert final["output"][0]["content"][0]["text"] == "Checking."
    body = await whole(client, **fields)
    assert without_ids(final["output"]) == without_ids(body["output"])
    for response_id in (final["id"], body["id"]):
        stored = (await client.get(f"/v1/responses/{response_id}")).json()
        assert [(i["type"], i["status"]) for i in stored["output"]] == [
            ("message", "completed"), ("function_call", "incomplete")]

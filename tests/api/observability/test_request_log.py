"""One structured log line per generation request at its completion (api/observability/request_log.py): chat,
completions and responses; whole, streamed, failed, cut by the client, and in the background."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, chat_body
from fastapi import FastAPI

from api.observability.request_log import format_fields
from engine.request import EngineRequest

pytestmark = pytest.mark.anyio

LOGGER = "api.observability.request_log"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level("INFO", logger=LOGGER)
    return caplog


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The fields of every request line so far; checks that the text carries the same fields."""
    found = []
    for record in caplog.records:
        if record.name == LOGGER:
            fields = record.request_log  # type: ignore[attr-defined]
            assert record.getMessage() == "request done " + format_fields(fields)
            found.append(fields)
    return found


async def test_whole_chat_line(client: httpx.AsyncClient, engine: FakeEngine, caplog: pytest.LogCaptureFixture) -> None:
    response = await client.post(
        "/v1/chat/completions", json=chat_body(max_tokens=3), headers={"x-request-id": "req 42"}
    )
    assert response.status_code == 200
    (line,) = lines(caplog)
    num_prompt = len(engine.requests[0].prompt_token_ids)
    assert line | {"ttft_s": None, "total_s": None} == {
        "request_id": "req 42", "endpoint": "/v1/chat/completions", "model": "fake-model", "adapter": None,
        "status": 200, "outcome": "ok", "prompt_tokens": num_prompt, "output_tokens": 3, "ttft_s": None,
        "total_s": None, "finish_reason": "length", "tool_calls": 0, "error": None,
    }
    assert 0 <= line["ttft_s"] <= line["total_s"] < 5
    text = caplog.records[-1].getMessage()
    assert 'request_id="req 42"' in text and "outcome=ok" in text and "adapter=-" in text


async def test_streamed_completions_sum_their_prompts(
    client: httpx.AsyncClient, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"model": "fake-model", "prompt": ["ab", "cde"], "max_tokens": 50, "stream": True}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    (line,) = lines(caplog)
    assert (line["prompt_tokens"], line["output_tokens"]) == (5, 24)
    assert (line["finish_reason"], line["outcome"], line["endpoint"]) == ("stop,stop", "ok", "/v1/completions")


async def test_responses_line_counts_tool_calls(
    client: httpx.AsyncClient, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    engine.max_model_len = 8192

    def script(request: EngineRequest, index: int) -> str:
        return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'

    engine.script_for = script
    body = {"model": "fake-model", "input": "Weather?", "tools": [WEATHER]}
    assert (await client.post("/v1/responses", json=body)).status_code == 200
    (line,) = lines(caplog)
    assert (line["endpoint"], line["tool_calls"], line["outcome"], line["status"]) == ("/v1/responses", 1, "ok", 200)
    assert line["finish_reason"] == "tool_calls"   # the decision the client got, not the engine's "stop"
    function = {k: WEATHER[k] for k in ("name", "parameters")}
    chat = chat_body(tools=[{"type": "function", "function": function}], n=2, stream=True)
    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
    assert lines(caplog)[-1]["finish_reason"] == "tool_calls,tool_calls"


async def test_rejected_request_is_an_error_line(client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=100_000))
    assert response.status_code == 400
    (line,) = lines(caplog)
    assert (line["status"], line["outcome"], line["output_tokens"], line["ttft_s"]) == (400, "error", 0, None)


async def test_failure_after_the_stream_began(
    client: httpx.AsyncClient, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    engine.fail_after_tokens = 2
    response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200 and '"error"' in response.text
    (line,) = lines(caplog)
    assert (line["status"], line["outcome"], line["error"]) == (200, "error", "RuntimeError")
    assert line["output_tokens"] == 2 and line["finish_reason"] is None


async def test_client_that_leaves_mid_stream_is_aborted(engine: FakeEngine, app: FastAPI,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    engine.script, engine.step_delay_s, engine.max_model_len = "x" * 500, 0.01, 4096
    left = asyncio.Event()
    received: asyncio.Queue[bytes] = asyncio.Queue()
    body = json.dumps(chat_body(stream=True, max_tokens=500)).encode()
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            received.put_nowait(message["body"])

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
             "query_string": b"", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "http",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("t", 80)}
    task = asyncio.ensure_future(app(scope, receive, send))
    for _ in range(3):
        await asyncio.wait_for(received.get(), 2)
    left.set()
    await asyncio.wait_for(task, 2)
    (line,) = lines(caplog)
    assert (line["status"], line["outcome"], line["error"]) == (200, "aborted", None)
    assert 0 < line["output_tokens"] < 500


async def test_background_response_is_logged_when_generation_ends(
    client: httpx.AsyncClient, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    engine.step_delay_s = 0.01
    queued = (await client.post("/v1/responses", json={"model": "fake-model", "input": "x", "background": True}))
    assert queued.status_code == 200
    assert lines(caplog) == []                                   # answered, but still generating
    for _ in range(500):
        if (await client.get(f"/v1/responses/{queued.json()['id']}")).json()["status"] == "completed":
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    (line,) = lines(caplog)
    assert (line["status"], line["outcome"], line["output_tokens"], line["finish_reason"]) == (200, "ok", 12, "stop")
    assert line["total_s"] >= 11 * 0.01


async def test_other_routes_are_not_logged(client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    assert (await client.get("/v1/models")).status_code == 200
    assert (await client.get("/health")).status_code == 200
    assert lines(caplog) == []


async def test_messages_stream_line(client: httpx.AsyncClient, engine: FakeEngine,
                                    caplog: pytest.LogCaptureFixture) -> None:
    body = {"model": "fake-model", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    response = await client.post("/v1/messages", json=body)
    assert response.status_code == 200 and "message_stop" in response.text
    (line,) = lines(caplog)
    assert line["endpoint"] == "/v1/messages" and line["outcome"] == "ok" and line["status"] == 200
    assert line["prompt_tokens"] == len(engine.requests[0].prompt_token_ids) and line["output_tokens"] == 4

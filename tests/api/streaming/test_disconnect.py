"""A client that goes away aborts its engine request at once (streamed, whole, before the first token)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, chat_body
from fastapi import FastAPI

from api.app import create_app
from api.config import ServerConfig

pytestmark = pytest.mark.anyio


class AsgiCall:
    """Drives one HTTP request through the ASGI app by hand, so the test decides when the client leaves."""

    def __init__(self, app: FastAPI, path: str, body: dict[str, Any]) -> None:
        self.app = app
        self.path = path
        self.body = json.dumps(body).encode()
        self.messages: list[dict[str, Any]] = []
        self.body_chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self.left = asyncio.Event()
        self._sent_body = False

    async def receive(self) -> dict[str, Any]:
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            self.body_chunks.put_nowait(message["body"])

    def start(self) -> asyncio.Task[None]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 5000),
            "server": ("test", 80),
        }
        return asyncio.ensure_future(self.app(scope, self.receive, self.send))


@pytest.fixture
def slow_engine() -> FakeEngine:
    return FakeEngine(script="1\n2\n3\n" * 200, step_delay_s=0.01, max_model_len=4096)


@pytest.fixture
def slow_app(slow_engine: FakeEngine) -> FastAPI:
    return create_app(slow_engine, ServerConfig(sse_ping_interval_s=0))


async def test_stream_disconnect_aborts(slow_app: FastAPI, slow_engine: FakeEngine) -> None:
    call = AsgiCall(slow_app, "/v1/chat/completions", chat_body(stream=True, max_tokens=1000))
    task = call.start()
    for _ in range(3):
        await asyncio.wait_for(call.body_chunks.get(), 2)
    call.left.set()
    await asyncio.wait_for(task, 2)
    (request,) = slow_engine.requests
    assert slow_engine.aborted == [request.request_id]
    assert slow_engine.completed == []


async def test_whole_answer_disconnect_aborts(slow_app: FastAPI, slow_engine: FakeEngine) -> None:
    call = AsgiCall(
        slow_app, "/v1/completions", {"model": "fake-model", "prompt": ["a", "b"], "max_tokens": 1000}
    )
    task = call.start()
    await asyncio.sleep(0.1)
    call.left.set()
    await asyncio.wait_for(task, 2)
    assert sorted(slow_engine.aborted) == sorted(r.request_id for r in slow_engine.requests)
    assert len(slow_engine.aborted) == 2 and slow_engine.completed == []


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_before_first_token_aborts(stream: bool) -> None:
    engine = FakeEngine(first_token_delay_s=30)
    app = create_app(engine, ServerConfig(sse_ping_interval_s=0))
    call = AsgiCall(app, "/v1/chat/completions", chat_body(stream=stream))
    task = call.start()
    await asyncio.sleep(0.1)
    call.left.set()
    await asyncio.wait_for(task, 2)
    assert engine.aborted == [engine.requests[0].request_id]
    assert call.messages[0]["status"] == 499  # nobody reads it; no event stream was started


async def test_other_requests_finish_while_one_is_abandoned(
    slow_app: FastAPI, slow_engine: FakeEngine
) -> None:
    call = AsgiCall(slow_app, "/v1/chat/completions", chat_body(stream=True, max_tokens=1000))
    task = call.start()
    await asyncio.wait_for(call.body_chunks.get(), 2)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=slow_app), base_url="http://t") as client:
        other = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat_body(max_tokens=5)))
        await asyncio.sleep(0.02)
        call.left.set()
        response = await asyncio.wait_for(other, 2)
    await asyncio.wait_for(task, 2)
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"] == "1\n2\n3"
    assert len(slow_engine.aborted) == 1 and len(slow_engine.completed) == 1


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
async def test_disconnect_while_sending_the_body_is_an_abort(path: str, caplog) -> None:
    """A client that leaves half way through its body gets a 499 and an `aborted` log line, not an
    unhandled-error traceback."""
    caplog.set_level(logging.INFO, logger="api.observability.request_log")
    engine = FakeEngine()
    app = create_app(engine, ServerConfig(sse_ping_interval_s=0))
    call = AsgiCall(app, path, chat_body())
    messages = iter([{"type": "http.request", "body": call.body[:10], "more_body": True},
                     {"type": "http.disconnect"}])

    async def receive() -> dict[str, Any]:
        return next(messages)

    call.receive = receive  # type: ignore[method-assign]
    await asyncio.wait_for(call.start(), 2)
    assert call.messages[0]["status"] == 499 and engine.requests == []
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert "outcome=aborted" in caplog.text

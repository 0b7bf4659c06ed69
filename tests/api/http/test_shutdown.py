"""Graceful shutdown in-process: the drain gate (503 + Retry-After, /metrics open), running
requests finishing within the grace period, and the rest aborted cleanly after it."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from api_support import FakeEngine, chat_body, sse_events, sse_json
from fastapi import FastAPI

from api.http.shutdown import drain

pytestmark = pytest.mark.anyio


async def drain_app(app: FastAPI, engine: FakeEngine, grace_s: float) -> bool:
    return await drain(app.state.drain, app.state.responses.background, engine, grace_s)


async def wait_in_flight(app: FastAPI, count: int) -> None:
    for _ in range(500):
        if app.state.drain.num_in_flight + app.state.responses.background.num_running >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("requests never started")


async def test_draining_app_refuses_new_requests_with_503(app: FastAPI, client: httpx.AsyncClient) -> None:
    app.state.drain.draining = True
    r = await client.post("/v1/chat/completions", json=chat_body(), headers={"x-request-id": "late-1"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.headers["x-request-id"] == "late-1"
    assert r.json()["error"]["code"] == "shutting_down" and r.json()["error"]["type"] == "server_error"
    health = await client.get("/health")
    assert health.status_code == 503 and health.json()["error"]["code"] == "shutting_down"
    assert (await client.get("/metrics")).status_code == 200
    assert app.state.drain.num_in_flight == 0


async def test_running_stream_finishes_within_the_grace_period(
    app: FastAPI, client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.step_delay_s = 0.02
    stream = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat_body(stream=True)))
    await wait_in_flight(app, 1)
    assert await drain_app(app, engine, grace_s=10) is True
    chunks = sse_json((await stream).text)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello world!"
    assert engine.abort_all_calls == 0
    assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 503


async def test_requests_left_after_the_grace_period_are_aborted_cleanly(
    app: FastAPI, client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.step_delay_s = 0.05
    engine.script = "x" * 200
    body = {"model": "fake-model", "input": "x", "max_output_tokens": 200}
    streamed = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat_body(stream=True)))
    whole = asyncio.ensure_future(client.post("/v1/chat/completions", json=chat_body()))
    queued = (await client.post("/v1/responses", json={**body, "background": True})).json()
    await wait_in_flight(app, 3)
    started = asyncio.get_running_loop().time()
    assert await drain_app(app, engine, grace_s=0.3) is False
    assert asyncio.get_running_loop().time() - started < 3
    assert engine.abort_all_calls == 1
    payloads = sse_events((await streamed).text)
    assert "[DONE]" not in payloads and json.loads(payloads[-1])["error"]["code"] == "request_aborted"
    r = await whole
    assert r.status_code == 503 and r.json()["error"]["code"] == "request_aborted"
    stored = (await app.state.responses.store.get(queued["id"]))
    assert stored is not None and stored.status == "failed"
    assert app.state.drain.num_in_flight == 0 and app.state.responses.background.num_running == 0

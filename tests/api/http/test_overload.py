"""Overload (429 + Retry-After), request timeouts (408) and a dead engine (500, /health 503) as
every generation route answers them: whole, streamed and Responses background."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, chat_body, sse_events
from fastapi import FastAPI

from api.cli.serve import build_configs, build_parser
from engine.errors import RequestTimedOut

pytestmark = pytest.mark.anyio

GENERATION_ROUTES = [
    ("/v1/chat/completions", chat_body()),
    ("/v1/chat/completions", chat_body(stream=True)),
    ("/v1/completions", {"model": "fake-model", "prompt": "Say hello."}),
    ("/v1/completions", {"model": "fake-model", "prompt": ["a", "b"], "stream": True}),
    ("/v1/responses", {"model": "fake-model", "input": "Say hello."}),
    ("/v1/responses", {"model": "fake-model", "input": "Say hello.", "stream": True}),
    ("/v1/responses", {"model": "fake-model", "input": "Say hello.", "background": True}),
]
ROUTE_IDS = ["chat", "chat-stream", "completions", "completions-batch-stream", "responses", "responses-stream",
             "responses-background"]


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(("path", "body"), GENERATION_ROUTES, ids=ROUTE_IDS)
async def test_overload_is_429_with_retry_after_and_queues_nothing(
    app: FastAPI, client: httpx.AsyncClient, engine: FakeEngine, path: str, body: dict[str, Any]
) -> None:
    engine.overloaded = True
    r = await client.post(path, json=body)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    error = error_of(r)
    assert error["type"] == "rate_limit_error" and error["code"] == "overloaded"
    assert "waiting" in error["message"]
    assert engine.requests == [] and app.state.responses.background.num_running == 0
    engine.overloaded = False
    assert (await client.post(path, json=body)).status_code == 200


@pytest.mark.parametrize(("path", "body"), GENERATION_ROUTES, ids=ROUTE_IDS)
async def test_dead_engine_is_500_at_once_and_health_503(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, body: dict[str, Any]
) -> None:
    engine.healthy = False
    r = await asyncio.wait_for(client.post(path, json=body), 5)
    assert r.status_code == 500
    assert error_of(r) == {"message": "the engine is not running", "type": "server_error", "param": None,
                           "code": "engine_dead"}
    health = await client.get("/health")
    assert health.status_code == 503 and error_of(health)["code"] == "engine_dead"


async def test_timeout_before_the_first_token_is_408(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.fail_after_tokens = 0
    engine.failure = RequestTimedOut("the request did not finish within 2 s (--request-timeout)")
    for stream in (False, True):
        r = await client.post("/v1/chat/completions", json=chat_body(stream=stream))
        assert r.status_code == 408
        assert error_of(r) == {"message": "the request did not finish within 2 s (--request-timeout)",
                               "type": "server_error", "param": None, "code": "request_timeout"}


async def test_timeout_mid_stream_ends_the_stream_with_an_error_event(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.fail_after_tokens = 3
    engine.failure = RequestTimedOut("the request did not finish within 2 s (--request-timeout)")
    r = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert r.status_code == 200
    payloads = sse_events(r.text)
    assert "[DONE]" not in payloads and len(payloads) > 2
    assert json.loads(payloads[-1])["error"]["code"] == "request_timeout"
    r = await client.post("/v1/responses", json={"model": "fake-model", "input": "x", "stream": True})
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2]["code"] == "request_timeout" and events[-1]["response"]["status"] == "failed"


async def test_timed_out_background_response_is_stored_failed(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.fail_after_tokens = 2
    engine.failure = RequestTimedOut("the request did not finish within 2 s (--request-timeout)")
    queued = (await client.post("/v1/responses", json={"model": "fake-model", "input": "x",
                                                       "background": True})).json()
    for _ in range(200):
        stored = (await client.get(f"/v1/responses/{queued['id']}")).json()
        if stored["status"] not in ("queued", "in_progress"):
            break
        await asyncio.sleep(0.01)
    assert stored["status"] == "failed" and "--request-timeout" in stored["error"]["message"]


def test_cli_flags() -> None:
    args = build_parser().parse_args(["serve", "--max-waiting-requests", "3", "--request-timeout", "2.5",
                                      "--shutdown-grace", "7", "--timeout-keep-alive", "90"])
    engine_config, server_config = build_configs(args, {})
    assert engine_config.max_waiting_requests == 3 and engine_config.request_timeout_s == 2.5
    assert server_config.shutdown_grace_s == 7 and server_config.keep_alive_s == 90
    defaults = build_configs(build_parser().parse_args(["serve"]), {})
    assert defaults[0].max_waiting_requests == 256 and defaults[0].request_timeout_s is None
    assert defaults[1].shutdown_grace_s == 30 and defaults[1].keep_alive_s == 65

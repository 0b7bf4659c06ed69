"""`call_app`: the app of `api/app.py` (around the FakeEngine) driven in-process as a replica drives it."""

from __future__ import annotations

import asyncio
import json

from api_support import FakeEngine

from api.app import create_app
from api.config import ServerConfig
from api.replicas.asgi_call import ResponseStart, call_app
from api.replicas.forwarded import ForwardedRequest

REPLICA = ((b"x-structserve-replica", b"3"),)


def post(path: str, body: dict) -> ForwardedRequest:
    return ForwardedRequest("POST", path, b"", ((b"content-type", b"application/json"),), json.dumps(body).encode())


async def collect(app, request: ForwardedRequest) -> tuple[ResponseStart, bytes]:
    parts = [part async for part in call_app(app, request, REPLICA)]
    assert isinstance(parts[0], ResponseStart) and all(isinstance(p, bytes) for p in parts[1:])
    return parts[0], b"".join(parts[1:])   # type: ignore[arg-type]


def test_whole_answers_errors_and_streams_come_back_with_the_replica_header() -> None:
    app = create_app(FakeEngine(script="Hello world!"), ServerConfig(sse_ping_interval_s=0))
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}

    async def scenario() -> None:
        start, body = await collect(app, post("/v1/chat/completions", chat))
        assert start.status == 200 and (b"x-structserve-replica", b"3") in start.headers
        assert json.loads(body)["choices"][0]["message"]["content"] == "Hello"
        start, body = await collect(app, post("/v1/chat/completions", {**chat, "bogus": 1}))
        assert start.status == 400 and json.loads(body)["error"]["param"] == "bogus"
        start, body = await collect(app, post("/v1/chat/completions", {**chat, "stream": True}))
        assert start.status == 200 and body.decode().rstrip().endswith("data: [DONE]")
        health = ForwardedRequest("GET", "/health", b"", (), b"")
        start, body = await collect(app, health)
        assert start.status == 200 and body == b""

    asyncio.run(scenario())


def test_closing_the_stream_early_disconnects_the_request_and_aborts_it_in_the_engine() -> None:
    engine = FakeEngine(script="1\n2\n3\n" * 200, step_delay_s=0.01, max_model_len=4096)
    app = create_app(engine, ServerConfig(sse_ping_interval_s=0))
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 500, "stream": True}

    async def scenario() -> None:
        stream = call_app(app, post("/v1/chat/completions", chat))
        assert isinstance(await stream.__anext__(), ResponseStart)
        await stream.__anext__()   # the first event
        await stream.aclose()      # what Serve does when the client goes away
        for _ in range(100):
            if engine.aborted:
                break
            await asyncio.sleep(0.02)
        assert len(engine.aborted) == 1

    asyncio.run(scenario())

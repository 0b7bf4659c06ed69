"""The official `openai` client against the app: over ASGI, and over a real uvicorn socket."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Iterator

import openai
import pytest
import uvicorn
from api_support import FakeEngine, sdk_client
from fastapi import FastAPI

from api.app import create_app
from api.config import ServerConfig

MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
async def async_openai(app: FastAPI) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sdk_client(app) as client:
        yield client


@pytest.mark.anyio
async def test_whole_and_streamed_chat(async_openai: openai.AsyncOpenAI) -> None:
    whole = await async_openai.chat.completions.create(model="default", messages=MESSAGES, max_tokens=5)  # type: ignore[arg-type]
    assert whole.choices[0].message.content == "Hello" and whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 5
    stream = await async_openai.chat.completions.create(
        model="default", messages=MESSAGES, stream=True, n=2, stream_options={"include_usage": True}
    )  # type: ignore[arg-type]
    texts = {0: "", 1: ""}
    usage = None
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
        usage = chunk.usage or usage
    assert texts == {0: "Hello world!", 1: "Hello world! #1"}
    assert usage is not None and usage.completion_tokens == 12 + 15


@pytest.mark.anyio
async def test_completions(async_openai: openai.AsyncOpenAI) -> None:
    result = await async_openai.completions.create(model="default", prompt="x", max_tokens=3, logprobs=1)
    assert result.choices[0].text == "Hel" and result.choices[0].logprobs is not None
    chunks = [
        c async for c in await async_openai.completions.create(model="default", prompt="x", stream=True)
    ]
    assert "".join(c.choices[0].text for c in chunks) == "Hello world!"


@pytest.mark.anyio
async def test_errors_raise_the_sdk_exceptions(async_openai: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await async_openai.chat.completions.create(model="default", messages=MESSAGES, temperature=2.5)  # type: ignore[arg-type]
    assert bad.value.param == "temperature" and bad.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as missing:
        await async_openai.chat.completions.create(model="gpt-9", messages=MESSAGES)  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        await async_openai.chat.completions.create(
            model="default",
            messages=MESSAGES,  # type: ignore[arg-type]
            extra_body={"foo": 1},
        )
    engine.fail_after_tokens = 2
    stream = await async_openai.chat.completions.create(model="default", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError, match="internal server error"):
        async for _ in stream:
            pass


@pytest.fixture
def live_server() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(script="1\n2\n3\n" * 500, step_delay_s=0.005, max_model_len=8192)
    app = create_app(engine, ServerConfig(sse_ping_interval_s=0))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1", engine
    server.should_exit = True
    thread.join(5)


def test_real_socket_stream_and_disconnect(live_server: tuple[str, FakeEngine]) -> None:
    base_url, engine = live_server
    client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    whole = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
    assert whole.choices[0].message.content == "1\n2\n"
    stream = client.chat.completions.create(model="default", messages=MESSAGES, stream=True, max_tokens=3000)  # type: ignore[arg-type]
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 2
    while len(engine.aborted) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(engine.aborted) == 1 and len(engine.completed) == 1
    after = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2)  # type: ignore[arg-type]
    assert after.choices[0].message.content == "1\n"

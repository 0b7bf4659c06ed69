"""The official `anthropic` client against the app over ASGI: messages.create, messages.stream
(the SDK assembles its own final message), count_tokens, errors parsed into the SDK's exception
classes, and the API key sent as x-api-key."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest
from api_support import FakeEngine, anthropic_client
from fastapi import FastAPI

from api.app import create_app
from api.config import ServerConfig
from engine.request import EngineRequest

pytestmark = pytest.mark.anyio

MESSAGES: list[Any] = [{"role": "user", "content": "Say hello."}]
WEATHER = {"name": "get_weather", "description": "Weather of a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=8192)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic_client(app) as client:
        yield client


async def test_create(client: anthropic.AsyncAnthropic) -> None:
    message = await client.messages.create(model="fake-model", max_tokens=64, messages=MESSAGES)
    assert message.content[0].type == "text" and message.content[0].text == "Hello world!"
    assert message.stop_reason == "end_turn" and message.usage.output_tokens == 12


async def test_stream_final_message_equals_create(client: anthropic.AsyncAnthropic) -> None:
    whole = await client.messages.create(model="fake-model", max_tokens=64, messages=MESSAGES)
    async with client.messages.stream(model="fake-model", max_tokens=64, messages=MESSAGES) as stream:
        texts = [text async for text in stream.text_stream]
        final = await stream.get_final_message()
    assert "".join(texts) == "Hello world!"
    assert [b.model_dump(include={"type", "text"}) for b in final.content] == [
        b.model_dump(include={"type", "text"}) for b in whole.content]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


async def test_stream_forced_tool(client: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    def script(request: EngineRequest, index: int) -> str:
        return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'

    engine.script_for = script
    async with client.messages.stream(model="fake-model", max_tokens=512, messages=MESSAGES, tools=[WEATHER],
                                      tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        final = await stream.get_final_message()
    (block,) = final.content
    assert block.type == "tool_use" and block.name == "get_weather" and block.input == {"city": "Lima"}
    assert block.id.startswith("toolu_") and final.stop_reason == "tool_use"


async def test_count_tokens(client: anthropic.AsyncAnthropic) -> None:
    counted = await client.messages.count_tokens(model="fake-model", messages=MESSAGES, system="Be brief.")
    message = await client.messages.create(model="fake-model", max_tokens=8, messages=MESSAGES, system="Be brief.")
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


async def test_errors_are_sdk_exceptions(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as not_found:
        await client.messages.create(model="nope", max_tokens=8, messages=MESSAGES)
    assert not_found.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model="fake-model", max_tokens=8, messages=[
            {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}])
    assert "image" in str(bad.value)


async def test_overloaded_is_sdk_error(client: anthropic.AsyncAnthropic, engine: FakeEngine) -> None:
    engine.overloaded = True
    with pytest.raises(anthropic.InternalServerError) as overloaded:
        await client.messages.create(model="fake-model", max_tokens=8, messages=MESSAGES)
    assert overloaded.value.status_code == 529


async def test_api_key_as_x_api_key(engine: FakeEngine) -> None:
    app = create_app(engine, ServerConfig(sse_ping_interval_s=0, api_key="secret"))
    try:
        async with anthropic_client(app, "secret") as client:
            message = await client.messages.create(model="fake-model", max_tokens=8, messages=MESSAGES)
            assert message.content[0].text == "Hello wo"
        async with anthropic_client(app, "wrong") as client:
            with pytest.raises(anthropic.AuthenticationError) as denied:
                await client.messages.create(model="fake-model", max_tokens=8, messages=MESSAGES)
        assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as raw:
            body = {"model": "fake-model", "max_tokens": 8, "messages": MESSAGES}
            bearer = await raw.post("/v1/messages", json=body, headers={"authorization": "Bearer secret"})
            assert bearer.status_code == 200
            # x-api-key is accepted on the OpenAI routes too
            models = await raw.get("/v1/models", headers={"x-api-key": "secret"})
            assert models.status_code == 200 and json.loads(models.text)["data"]
            assert (await raw.get("/v1/models")).status_code == 401
    finally:
        app.state.responses.store.close()

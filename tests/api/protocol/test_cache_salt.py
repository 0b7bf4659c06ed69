"""cache_salt (vLLM's field) on chat, completions and Responses: a non-empty string, handed to the
engine request as it is; Anthropic's Messages API has no such field (an unknown field there)."""

from __future__ import annotations

import httpx
import pytest
from api_support import FakeEngine, chat_body

pytestmark = pytest.mark.anyio

BODIES = {
    "/v1/chat/completions": chat_body(max_tokens=2),
    "/v1/completions": {"model": "fake-model", "prompt": "Say hello.", "max_tokens": 2},
    "/v1/responses": {"model": "fake-model", "input": "Say hello.", "max_output_tokens": 2},
}


@pytest.mark.parametrize("path", list(BODIES))
async def test_cache_salt_reaches_the_engine_request(client: httpx.AsyncClient, engine: FakeEngine,
                                                     path: str) -> None:
    r = await client.post(path, json={**BODIES[path], "cache_salt": "tenant-a"})
    assert r.status_code == 200, r.text
    r = await client.post(path, json=BODIES[path])
    assert r.status_code == 200, r.text
    assert [request.cache_salt for request in engine.requests] == ["tenant-a", None]


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("salt", ["", 5, ["a"]])
async def test_cache_salt_must_be_a_non_empty_string(client: httpx.AsyncClient, engine: FakeEngine,
                                                     path: str, salt: object) -> None:
    r = await client.post(path, json={**BODIES[path], "cache_salt": salt})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
    assert engine.requests == []


async def test_messages_has_no_cache_salt(client: httpx.AsyncClient) -> None:
    body = {"model": "fake-model", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}],
            "cache_salt": "tenant-a"}
    r = await client.post("/v1/messages", json=body)
    assert r.status_code == 400 and "cache_salt" in r.text

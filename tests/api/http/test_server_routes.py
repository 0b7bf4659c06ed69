"""Auth, x-request-id, /v1/models, /health, /version, /tokenize, /detokenize."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from api_support import FakeEngine, chat_body

from api.app import create_app
from api.config import ServerConfig

pytestmark = pytest.mark.anyio


@pytest.fixture
async def secured(engine: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine, ServerConfig(api_key="s3cret", served_model_names=("smol", "smol-2")))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}, {"Authorization": "Basic s3cret"}],
)
async def test_api_key_required_on_v1(
    secured: httpx.AsyncClient, engine: FakeEngine, headers: dict[str, str]
) -> None:
    for method, path in (
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models"),
    ):
        response = await secured.request(method, path, json=chat_body(model="smol"), headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
    assert engine.requests == []


async def test_api_key_accepted(secured: httpx.AsyncClient) -> None:
    response = await secured.post(
        "/v1/chat/completions", json=chat_body(model="smol-2"), headers={"Authorization": "Bearer s3cret"}
    )
    assert response.status_code == 200
    assert response.json()["model"] == "smol"
    assert (await secured.get("/health")).status_code == 200


async def test_served_model_names(secured: httpx.AsyncClient) -> None:
    auth = {"Authorization": "Bearer s3cret"}
    models = (await secured.get("/v1/models", headers=auth)).json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["root"], m["owned_by"]) for m in models["data"]] == [
        ("smol", "model", "/models/fake.gguf", "structserve"),
        ("smol-2", "model", "/models/fake.gguf", "structserve"),
    ]
    assert (await secured.get("/v1/models/smol-2", headers=auth)).json()["id"] == "smol-2"
    response = await secured.post("/v1/chat/completions", json=chat_body(model="fake-model"), headers=auth)
    assert response.status_code == 404


async def test_request_id_header(client: httpx.AsyncClient) -> None:
    echoed = await client.post("/v1/chat/completions", json=chat_body(), headers={"x-request-id": "abc-123"})
    assert echoed.headers["x-request-id"] == "abc-123"
    fresh = [
        await client.get("/health"),
        await client.post("/v1/chat/completions", json=chat_body(n=0)),
        await client.get("/nope"),
        await client.post("/v1/chat/completions", json=chat_body(stream=True)),
    ]
    ids = [r.headers["x-request-id"] for r in fresh]
    assert all(len(i) == 32 for i in ids) and len(set(ids)) == 4


async def test_unexpected_exception_is_a_500_error_object(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    def broken(request: object) -> None:
        raise KeyError("boom")

    engine.generate = broken  # type: ignore[assignment,method-assign]
    response = await client.post("/v1/chat/completions", json=chat_body(), headers={"x-request-id": "r1"})
    assert response.status_code == 500
    assert response.json() == {
        "error": {"message": "internal server error", "type": "server_error", "param": None, "code": None}
    }
    assert response.headers["x-request-id"] == "r1"


async def test_health_and_version(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    assert (await client.get("/health")).status_code == 200
    engine.healthy = False
    response = await client.get("/health")
    assert response.status_code == 503 and response.json()["error"]["code"] == "engine_dead"
    assert isinstance((await client.get("/version")).json()["version"], str)


async def test_tokenize_and_detokenize(client: httpx.AsyncClient) -> None:
    body = (await client.post("/tokenize", json={"prompt": "hi"})).json()
    assert body == {"count": 2, "max_model_len": 256, "tokens": [104, 105], "token_strs": None}
    chat = (
        await client.post(
            "/tokenize", json={"messages": [{"role": "user", "content": "hi"}], "return_token_strs": True}
        )
    ).json()
    assert chat["tokens"][0] == 256 and chat["token_strs"][0] == "<|im_start|>"
    assert chat["count"] == len(chat["tokens"])
    assert (await client.post("/detokenize", json={"tokens": [104, 105]})).json() == {"prompt": "hi"}
    bad = await client.post("/detokenize", json={"tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    both = await client.post(
        "/tokenize", json={"prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    )
    assert both.status_code == 400


async def test_tokenize_empty_messages_is_a_400(client: httpx.AsyncClient) -> None:
    # fuzzing regression: [] reached the chat template, whose ValueError became a 500
    for extra in ({}, {"continue_final_message": True, "add_generation_prompt": False}):
        response = await client.post("/tokenize", json={"messages": [], **extra})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "messages"

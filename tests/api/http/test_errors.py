"""Invalid requests get 4xx with the OpenAI error object and never reach the engine."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_support import FakeEngine, chat_body

from engine.errors import EngineDeadError, EngineOverloaded

pytestmark = pytest.mark.anyio

COMPLETION = {"model": "fake-model", "prompt": "test"}


def assert_error(
    response: httpx.Response, status: int, param: str | None, code: str | None = None
) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param
    assert error["code"] == code
    return error


CHAT_INVALID = [
    # (fields, param)
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_completion_tokens": -3}, "max_completion_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": 0}, "top_p"),
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
    ({"logprobs": "yes"}, "logprobs"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"stop": 5}, "stop"),
    ({"stop": {"a": 1}}, "stop"),  # an object where a union of str / list belongs: no "stop.str"
    ({"messages": [{"role": "user", "content": {"text": "x"}}]}, "messages[0].content"),
    ({"stop": [""]}, "stop"),
    ({"seed": "abc"}, "seed"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"65": 200}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),  # outside the vocabulary
    ({"stop_token_ids": [-1]}, "stop_token_ids"),  # outside the vocabulary (the engine's check)
    ({"stop_token_ids": [2, 259]}, "stop_token_ids"),
    ({"logit_bias": {"²": 1}}, "logit_bias"),  # a digit to str.isdigit(), not to int()
    ({"messages": None}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0]"),
    ({"messages": [{"content": "x"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_tokens": 50, "max_tokens": 10}, "min_tokens"),
    ({"foo": 1}, "foo"),
    ({"model": 5}, "model"),
]


@pytest.mark.parametrize(("fields", "param"), CHAT_INVALID, ids=[str(p) for _, p in CHAT_INVALID])
async def test_invalid_chat_bodies(
    client: httpx.AsyncClient, engine: FakeEngine, fields: dict[str, Any], param: str
) -> None:
    error = assert_error(await client.post("/v1/chat/completions", json=chat_body(**fields)), 400, param)
    assert error["type"] == "invalid_request_error"
    assert engine.requests == []


async def test_missing_messages(client: httpx.AsyncClient) -> None:
    error = assert_error(
        await client.post("/v1/chat/completions", json={"model": "fake-model"}), 400, "messages"
    )
    assert "messages" in error["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/tokenize"])
@pytest.mark.parametrize("raw", [b"{bad json", b"", b"[1, 2]", b"null", b"\xff\xfe"])
async def test_malformed_bodies(client: httpx.AsyncClient, path: str, raw: bytes) -> None:
    response = await client.post(path, content=raw, headers={"content-type": "application/json"})
    assert assert_error(response, 400, None)["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "schema": {"type": "object"}},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": "not an object"}},
        {"type": "yaml"},
        "json",
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_malformed_response_format(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, response_format: Any
) -> None:
    body = (
        chat_body(response_format=response_format)
        if "chat" in path
        else {**COMPLETION, "response_format": response_format}
    )
    response = await client.post(path, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"].startswith("response_format") and error["type"] == "invalid_request_error"
    assert error["code"] is None
    assert engine.requests == []
    assert (await client.post(path, json=chat_body() if "chat" in path else COMPLETION)).status_code == 200


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0].content[0].type",
        ),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"functions": [{"name": "f"}]}, "functions"),
    ],
)
async def test_not_yet_supported_features_say_so(
    client: httpx.AsyncClient, engine: FakeEngine, fields: dict[str, Any], param: str
) -> None:
    error = assert_error(
        await client.post("/v1/chat/completions", json=chat_body(**fields)), 400, param, "not_supported"
    )
    assert "not supported" in error["message"]
    assert engine.requests == []


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"suffix": "x"}, "suffix", "not_supported"),
        ({"best_of": 3}, "best_of", "not_supported"),
        ({"best_of": 1, "n": 2}, "best_of", None),
        ({"echo": True, "logprobs": 1}, "echo", "not_supported"),
        ({"prompt": None}, "prompt", None),
        ({"prompt": []}, "prompt", None),
        ({"prompt": ""}, "prompt", None),
        ({"prompt": [1, 99999]}, "prompt", None),
        ({"prompt": [[1], [-1]]}, "prompt[1]", None),
        ({"prompt": ["a", 1]}, "prompt[1]", None),
        ({"prompt": {"text": "x"}}, "prompt", None),
        ({"logprobs": 21}, "logprobs", None),
        ({"logprobs": True}, "logprobs", None),
        ({"max_tokens": -1}, "max_tokens", None),
        ({"messages": []}, "messages", None),
    ],
)
async def test_invalid_completion_bodies(
    client: httpx.AsyncClient, engine: FakeEngine, fields: dict[str, Any], param: str, code: str | None
) -> None:
    assert_error(await client.post("/v1/completions", json={**COMPLETION, **fields}), 400, param, code)
    assert engine.requests == []


async def test_unknown_model_is_404(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    for path, body in (
        ("/v1/chat/completions", chat_body(model="gpt-9")),
        ("/v1/completions", {**COMPLETION, "model": "gpt-9"}),
    ):
        error = assert_error(await client.post(path, json=body), 404, "model", "model_not_found")
        assert "gpt-9" in error["message"] and "fake-model" in error["message"]
    assert_error(await client.get("/v1/models/gpt-9"), 404, "model", "model_not_found")
    assert engine.requests == []


async def test_error_bodies_quote_client_values_bounded(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    """A 100 000-character unknown field name, model id or logit_bias key comes back cut: message
    at most MAX_ERROR_MESSAGE_CHARS, param at most MAX_ERROR_PARAM_CHARS, the cut marked (case 037)."""
    from api.http.errors import MAX_ERROR_MESSAGE_CHARS, MAX_ERROR_PARAM_CHARS

    huge = "k" * 100_000
    for body, status in ((chat_body(**{huge: 1}), 400), (chat_body(model=huge), 404),
                         (chat_body(logit_bias={huge: 1}), 400)):
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == status, response.text[:300]
        error = response.json()["error"]
        assert len(error["message"]) <= MAX_ERROR_MESSAGE_CHARS and "characters, cut)" in error["message"], error
        assert error["param"] is None or len(error["param"]) <= MAX_ERROR_PARAM_CHARS, error["param"][:300]
    assert engine.requests == []


async def test_context_length_exceeded_names_both_numbers(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    long_text = "x" * 300
    response = await client.post(
        "/v1/chat/completions", json=chat_body(messages=[{"role": "user", "content": long_text}])
    )
    error = assert_error(response, 400, "messages", "context_length_exceeded")
    assert "256" in error["message"]
    response = await client.post(
        "/v1/completions", json={**COMPLETION, "prompt": "x" * 200, "max_tokens": 100}
    )
    error = assert_error(response, 400, "prompt", "context_length_exceeded")
    assert all(n in error["message"] for n in ("256", "200", "100", "300"))
    for stream in (False, True):   # a batch: the engine names the prompt; none of the batch is queued
        response = await client.post(
            "/v1/completions", json={**COMPLETION, "prompt": ["x", "x" * 300], "max_tokens": None, "stream": stream}
        )
        error = assert_error(response, 400, "prompt[1]", "context_length_exceeded")
        assert "leaves no room" in error["message"] and "300" in error["message"]
    assert engine.requests == []


async def test_engine_errors_are_mapped(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    async def overloaded(request: Any) -> Any:
        raise EngineOverloaded("too many requests are waiting")
        yield  # pragma: no cover

    async def dead(request: Any) -> Any:
        raise EngineDeadError("the engine is not running")
        yield  # pragma: no cover

    engine.generate = overloaded  # type: ignore[method-assign]
    assert_error(await client.post("/v1/chat/completions", json=chat_body()), 429, None, "overloaded")
    engine.generate = dead  # type: ignore[method-assign]
    error = assert_error(
        await client.post("/v1/chat/completions", json=chat_body(stream=True)), 500, None, "engine_dead"
    )
    assert error["type"] == "server_error"


async def test_unknown_route_and_method(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing"), 404, None)
    assert_error(await client.get("/v1/chat/completions"), 405, None)

"""SSE streaming of chat and text completions: framing, chunk order, usage chunk, n > 1, errors."""

from __future__ import annotations

import json

import httpx
import pytest
from api_support import FakeEngine, chat_body, sse_events, sse_json

pytestmark = pytest.mark.anyio


async def test_chat_stream_framing_and_chunks(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body(stream=True, max_tokens=5))
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = sse_json(response.text)
    assert {(c["id"], c["created"], c["model"], c["object"]) for c in chunks} == {
        (chunks[0]["id"], chunks[0]["created"], "fake-model", "chat.completion.chunk")
    }
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "Hello"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert finishes == ["length"]
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert all(c["usage"] is None for c in chunks)
    assert all(c["choices"] for c in chunks)
    assert engine.completed == [chunks[0]["id"]] and engine.aborted == []


async def test_include_usage_sends_one_final_usage_chunk(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    body = chat_body(stream=True, stream_options={"include_usage": True}, max_tokens=16)
    chunks = sse_json((await client.post("/v1/chat/completions", json=body)).text)
    with_usage = [c for c in chunks if c.get("usage") is not None]
    assert with_usage == [chunks[-1]]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert usage["prompt_tokens"] == len(engine.requests[0].prompt_token_ids) > 0
    assert 1 <= usage["completion_tokens"] <= 16
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    whole = (await client.post("/v1/chat/completions", json=chat_body(max_tokens=16, temperature=0))).json()
    assert usage["completion_tokens"] == whole["usage"]["completion_tokens"]
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]) == 1


async def test_continuous_usage_stats(client: httpx.AsyncClient) -> None:
    body = chat_body(
        stream=True, max_tokens=3, stream_options={"include_usage": True, "continuous_usage_stats": True}
    )
    chunks = sse_json((await client.post("/v1/chat/completions", json=body)).text)
    generated = [c["usage"]["completion_tokens"] for c in chunks[1:-1]]
    assert generated == sorted(generated) and generated[-1] == 3


async def test_n2_stream_indices(client: httpx.AsyncClient) -> None:
    chunks = sse_json((await client.post("/v1/chat/completions", json=chat_body(stream=True, n=2))).text)
    texts = {0: "", 1: ""}
    finishes: dict[int, list[str]] = {0: [], 1: []}
    roles = []
    for c in chunks:
        (choice,) = c["choices"]
        texts[choice["index"]] += choice["delta"].get("content", "")
        if "role" in choice["delta"]:
            roles.append(choice["index"])
        if choice["finish_reason"]:
            finishes[choice["index"]].append(choice["finish_reason"])
    assert roles == [0, 1]
    assert texts == {0: "Hello world!", 1: "Hello world! #1"}
    assert finishes == {0: ["stop"], 1: ["stop"]}


async def test_stream_logprobs(client: httpx.AsyncClient) -> None:
    body = chat_body(stream=True, max_tokens=2, logprobs=True, top_logprobs=1)
    chunks = sse_json((await client.post("/v1/chat/completions", json=body)).text)
    entries = [
        e for c in chunks if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert [e["token"] for e in entries] == ["H", "e"]
    assert entries[0]["top_logprobs"] == [{"token": "H", "logprob": -0.25, "bytes": [72]}]


async def test_error_after_stream_start_is_one_error_event(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.fail_after_tokens = 2
    response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    payloads = sse_events(response.text)
    assert "[DONE]" not in payloads
    error = json.loads(payloads[-1])
    assert error == {
        "error": {"message": "internal server error", "type": "server_error", "param": None, "code": None}
    }
    assert len(engine.aborted) == 1


async def test_completions_stream(client: httpx.AsyncClient) -> None:
    body = {
        "model": "fake-model",
        "prompt": ["ab", "cd"],
        "stream": True,
        "max_tokens": 3,
        "n": 2,
        "echo": True,
        "stream_options": {"include_usage": True},
    }
    chunks = sse_json((await client.post("/v1/completions", json=body)).text)
    assert {c["object"] for c in chunks} == {"text_completion"}
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert texts == {0: "abHel", 1: "abHel", 2: "cdHel", 3: "cdHel"}
    assert finishes == {i: "length" for i in range(4)}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    assert chunks[-1]["usage"]["prompt_tokens"] == 4


async def test_stream_without_stream_options_has_no_usage(client: httpx.AsyncClient) -> None:
    for path, body in (
        ("/v1/chat/completions", chat_body(stream=True)),
        ("/v1/completions", {"model": "fake-model", "prompt": "x", "stream": True}),
        ("/v1/chat/completions", chat_body(stream=True, stream_options={"include_usage": False})),
    ):
        chunks = sse_json((await client.post(path, json=body)).text)
        assert all(c.get("usage") is None and c["choices"] for c in chunks)

"""Every sampling range x every endpoint that has the field: a 400 in that endpoint's error shape
naming the field the client sent, and no engine request. The protocols check only types; the
ranges are SamplingParams' (`engine/sampling_params.py`), except Anthropic's narrower
temperature and top_k (`api/messages/protocol.py`)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from api_support import FakeEngine, chat_body

pytestmark = pytest.mark.anyio

CHAT_AND_COMPLETIONS = [
    # (fields, param): the SamplingFields both endpoints share
    ({"n": 0}, "n"),
    ({"n": 129}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -2.5}, "frequency_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"seed": -(2**63) - 1}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": -0.1}, "min_p"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
    ({"logit_bias": {"65": 100.5}}, "logit_bias"),
    ({"logit_bias": {"65": -101}}, "logit_bias"),
    ({"stop": ""}, "stop"),
    ({"stop": ["x", ""]}, "stop"),
]
CASES = [
    # (path, body, param)
    *[("/v1/chat/completions", chat_body(**fields), param) for fields, param in CHAT_AND_COMPLETIONS],
    *[("/v1/completions", {"model": "fake-model", "prompt": "test", **fields}, param)
      for fields, param in CHAT_AND_COMPLETIONS],
    ("/v1/chat/completions", chat_body(max_completion_tokens=0), "max_completion_tokens"),
    ("/v1/chat/completions", chat_body(max_completion_tokens=0, max_tokens=5), "max_completion_tokens"),
    ("/v1/chat/completions", chat_body(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("/v1/chat/completions", chat_body(logprobs=True, top_logprobs=-1), "top_logprobs"),
    ("/v1/completions", {"model": "fake-model", "prompt": "test", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"model": "fake-model", "prompt": "test", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"model": "fake-model", "prompt": "test", "best_of": 0}, "best_of"),
    *[("/v1/responses", {"model": "fake-model", "input": "hi", **fields}, param) for fields, param in [
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
        ({"seed": 2**64}, "seed"),
        ({"stop": [""]}, "stop"),
    ]],
    *[("/v1/messages", {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                        **fields}, param) for fields, param in [
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 1.5}, "temperature"),   # Anthropic's 0..1
        ({"top_k": 0}, "top_k"),                 # Anthropic's >= 1
        ({"stop_sequences": ["x", ""]}, "stop_sequences"),
    ]],
]


@pytest.mark.parametrize(("path", "body", "param"), CASES, ids=[f"{p}-{b}" for p, b, _ in CASES])
async def test_out_of_range_is_a_400_naming_the_field_sent(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, body: dict[str, Any], param: str
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == 400, response.text
    if path == "/v1/messages":
        assert response.json()["type"] == "error"
        error = response.json()["error"]
        assert set(error) == {"type", "message"} and error["type"] == "invalid_request_error"
        assert param in error["message"]
    else:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, None)
        assert error["message"].startswith(param) or param in error["message"], error["message"]
    assert engine.requests == []


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", chat_body(n=128, temperature=2, top_p=1, seed=2**64 - 1, max_tokens=1)),
    ("/v1/completions", {"model": "fake-model", "prompt": "t", "n": 2, "best_of": 2, "min_p": 1, "top_k": -1,
                         "seed": -(2**63), "logprobs": 20, "min_tokens": 1, "max_tokens": 1}),
    ("/v1/responses", {"model": "fake-model", "input": "hi", "temperature": 0, "top_logprobs": 20,
                       "max_output_tokens": 1}),
    ("/v1/messages", {"model": "fake-model", "max_tokens": 1, "temperature": 1, "top_k": 1, "top_p": 1,
                      "messages": [{"role": "user", "content": "hi"}]}),
])
async def test_range_edges_are_accepted(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, body: dict[str, Any]
) -> None:
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert len(engine.requests) == 1

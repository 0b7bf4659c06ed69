"""POST /v1/completions, whole responses: prompt forms, echo, logprobs, usage."""

from __future__ import annotations

import httpx
import pytest
from api_support import FakeEngine

pytestmark = pytest.mark.anyio


async def complete(client: httpx.AsyncClient, **fields: object) -> dict:
    response = await client.post("/v1/completions", json={"model": "fake-model", **fields})
    assert response.status_code == 200, response.text
    return response.json()


async def test_string_prompt(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = await complete(client, prompt="test", max_tokens=5)
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["choices"] == [{"index": 0, "text": "Hello", "logprobs": None, "finish_reason": "length"}]
    assert body["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 5,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    assert engine.requests[0].prompt_token_ids == list(b"test")


async def test_null_max_tokens_means_rest_of_context(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = await complete(client, prompt="test", temperature=0, max_tokens=None)
    assert body["choices"][0]["finish_reason"] == "stop"
    assert engine.requests[0].sampling_params.max_tokens is None   # the engine's budget: the rest of the context
    assert engine.limits.max_tokens(engine.requests[0]) == engine.max_model_len - 4


async def test_prompt_forms_and_choice_indices(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = await complete(client, prompt=["ab", "cde"], n=2, max_tokens=2)
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "He"), (1, "He"), (2, "He"), (3, "He")]
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 8
    assert len({r.request_id for r in engine.requests}) == 2
    await complete(client, prompt=[104, 105], max_tokens=1)
    assert engine.requests[-1].prompt_token_ids == [104, 105]
    body = await complete(client, prompt=[[104], [105, 106]], max_tokens=1)
    assert [r.prompt_token_ids for r in engine.requests[-2:]] == [[104], [105, 106]]
    assert len(body["choices"]) == 2


async def test_echo(client: httpx.AsyncClient) -> None:
    body = await complete(client, prompt="Say: ", echo=True, max_tokens=2)
    assert body["choices"][0]["text"] == "Say: He"
    body = await complete(client, prompt=[104, 105], echo=True, max_tokens=2)
    assert body["choices"][0]["text"] == "hiHe"


async def test_logprobs(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = await complete(client, prompt="x", max_tokens=3, logprobs=1)
    assert engine.requests[0].sampling_params.logprobs == 1
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["H", "e", "l"],
        "token_logprobs": [-0.25, -0.25, -0.25],
        "top_logprobs": [{"H": -0.25}, {"e": -0.25}, {"l": -0.25}],
        "text_offset": [0, 1, 2],
    }


async def test_best_of_equal_to_n_and_stop(client: httpx.AsyncClient) -> None:
    body = await complete(client, prompt="x", best_of=2, n=2, stop=" ")
    assert [c["text"] for c in body["choices"]] == ["Hello", "Hello"]
    assert {c["finish_reason"] for c in body["choices"]} == {"stop"}

"""POST /v1/chat/completions, whole responses (streaming: test_chat_streaming.py)."""

from __future__ import annotations

import httpx
import pytest
from api_support import FakeEngine, chat_body

pytestmark = pytest.mark.anyio


async def test_whole_chat_completion_has_the_openai_shape(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int)
    assert body["model"] == "fake-model"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello world!", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    prompt_len = len(engine.requests[0].prompt_token_ids)
    assert body["usage"] == {
        "prompt_tokens": prompt_len,
        "completion_tokens": 12,
        "total_tokens": prompt_len + 12,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    assert engine.completed == [body["id"]] and engine.aborted == []


async def test_prompt_is_the_rendered_chat_template(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    response = await client.post("/v1/chat/completions", json=chat_body(messages=messages))
    assert response.status_code == 200
    prompt = engine.tokenizer.decode(engine.requests[0].prompt_token_ids)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n"
        "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_sampling_params_follow_the_request(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json=chat_body(
            temperature=0,
            top_p=0.5,
            seed=7,
            stop=["xx", "yy"],
            max_completion_tokens=20,
            max_tokens=5,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            logit_bias={"65": 3.5},
            top_k=4,
            min_p=0.1,
            repetition_penalty=1.2,
            min_tokens=2,
            ignore_eos=True,
            stop_token_ids=[257],
            include_stop_str_in_output=True,
            skip_special_tokens=False,
        ),
    )
    assert response.status_code == 200, response.text
    params = engine.requests[0].sampling_params
    assert (params.temperature, params.top_p, params.seed, params.stop, params.max_tokens) == (
        0.0,
        0.5,
        7,
        ("xx", "yy"),
        20,
    )
    assert (params.presence_penalty, params.frequency_penalty, params.logit_bias) == (0.5, -0.5, {65: 3.5})
    assert (params.top_k, params.min_p, params.repetition_penalty, params.min_tokens) == (4, 0.1, 1.2, 2)
    assert params.ignore_eos and params.include_stop_str_in_output and not params.skip_special_tokens
    assert params.stop_token_ids == (257,) and params.logprobs is None


async def test_explicit_nulls_mean_defaults(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    nulls = {
        k: None
        for k in (
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "stop",
            "seed",
            "tools",
            "n",
            "logprobs",
            "top_logprobs",
            "stream",
            "stream_options",
            "response_format",
            "tool_choice",
            "user",
            "metadata",
        )
    }
    response = await client.post("/v1/chat/completions", json=chat_body(**nulls))
    assert response.status_code == 200, response.text
    params = engine.requests[0].sampling_params
    prompt_len = len(engine.requests[0].prompt_token_ids)
    assert params.max_tokens is None and engine.limits.max_tokens(engine.requests[0]) == engine.max_model_len - prompt_len
    assert (params.temperature, params.top_p, params.n, params.stop) == (1.0, 1.0, 1, ())


async def test_stop_and_length_finish_reasons(client: httpx.AsyncClient) -> None:
    stopped = (await client.post("/v1/chat/completions", json=chat_body(stop="wor"))).json()
    assert stopped["choices"][0]["message"]["content"] == "Hello "
    assert stopped["choices"][0]["finish_reason"] == "stop"
    cut = (await client.post("/v1/chat/completions", json=chat_body(max_tokens=3))).json()
    assert cut["choices"][0]["message"]["content"] == "Hel"
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == 3


async def test_n_choices(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/chat/completions", json=chat_body(n=3))).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in body["choices"]] == [
        "Hello world!",
        "Hello world! #1",
        "Hello world! #2",
    ]


async def test_logprobs_shape(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = (
        await client.post("/v1/chat/completions", json=chat_body(logprobs=True, top_logprobs=2, max_tokens=2))
    ).json()
    assert engine.requests[0].sampling_params.logprobs == 2
    content = body["choices"][0]["logprobs"]["content"]
    assert content == [
        {
            "token": "H",
            "logprob": -0.25,
            "bytes": [72],
            "top_logprobs": [{"token": "H", "logprob": -0.25, "bytes": [72]}],   # "x" was at -inf: omitted
        },
        {
            "token": "e",
            "logprob": -0.25,
            "bytes": [101],
            "top_logprobs": [{"token": "e", "logprob": -0.25, "bytes": [101]}],   # "x" was at -inf: omitted
        },
    ]
    plain = (await client.post("/v1/chat/completions", json=chat_body(logprobs=True, max_tokens=1))).json()
    assert plain["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []


async def test_model_aliases_and_omitted_model(client: httpx.AsyncClient) -> None:
    for model in ("default", "fake-model", None):
        body = chat_body(model=model) if model else {"messages": [{"role": "user", "content": "x"}]}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        assert response.json()["model"] == "fake-model"


async def test_accepted_and_ignored_openai_fields(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json=chat_body(
            user="u",
            metadata={"k": "v"},
            store=False,
            service_tier="auto",
            parallel_tool_calls=False,
            reasoning_effort="low",
            prompt_cache_key="k",
            safety_identifier="s",
            modalities=["text"],
            tools=[
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object"}, "strict": True},
                }
            ],
            tool_choice="none",
            response_format={"type": "text"},
        ),
    )
    assert response.status_code == 200, response.text


async def test_continue_final_message(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]
    response = await client.post(
        "/v1/chat/completions",
        json=chat_body(messages=messages, add_generation_prompt=False, continue_final_message=True),
    )
    assert response.status_code == 200, response.text
    assert engine.tokenizer.decode(engine.requests[0].prompt_token_ids).endswith("assistant\nHel")

"""Issue 6 end to end: a real server on SmolLM2 with peft adapters (made by peft for SmolLM2's
shapes, random non-zero A and B), driven through the `openai` client and httpx."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import MODEL

pytestmark = pytest.mark.slow

SYSTEM = " ".join(f"Rule {i}: answer briefly and politely about topic number {i}." for i in range(12))
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Continue the story in one sentence."}]
# served name: the acceptance cases' adapter (session fixture `case_adapters`, tests/e2e/cases_lora.py):
# rank 8 on q/v/o; rank 16 rsLoRA on six modules; rank 4 on down/up (random A and B, scale 0.1)
ADAPTERS = {"ad-a": "adapter-a", "ad-b": "adapter-b", "ad-c": "adapter-c"}


@pytest.fixture(scope="module")
def adapters(case_adapters) -> dict[str, Path]:
    """The three adapters, saved by peft with save_pretrained."""
    return {name: case_adapters[case_name] for name, case_name in ADAPTERS.items()}


@pytest.fixture(scope="module")
def lora_server(lora_runtime_server):
    """The session's run-time LoRA server (tests/e2e/conftest.py), which serves ad-a (`NAME=PATH`)
    and ad-b (the JSON form, base_model_name "smol") from its start, on float32 weights (answers
    are compared across batch sizes). These tests use only the names ad-a, ad-b and ad-c."""
    return lora_runtime_server


def chat(server, model: str, max_tokens: int = 24, messages=MESSAGES) -> tuple[str, int]:
    """(text, cached prompt tokens) of a greedy chat completion."""
    result = server.client().chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                     temperature=0)
    assert result.model == model
    details = result.usage.prompt_tokens_details
    return result.choices[0].message.content, (details.cached_tokens if details else 0) or 0


def test_openai_client_streams_an_adapter(lora_server) -> None:
    client = lora_server.client()
    chunks = list(client.chat.completions.create(model="ad-a", messages=MESSAGES[1:], max_tokens=20,
                                                 temperature=0, stream=True))
    assert chunks and all(c.model == "ad-a" for c in chunks)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole, _ = chat(lora_server, "ad-a", 20, MESSAGES[1:])
    base, _ = chat(lora_server, MODEL, 20, MESSAGES[1:])
    assert streamed == whole and whole != base
    completion = client.completions.create(model="ad-b", prompt="Once upon a time", max_tokens=8, temperature=0)
    assert completion.model == "ad-b" and completion.choices[0].text


def test_models_list_and_unknown_model(lora_server, adapters) -> None:
    data = httpx.get(lora_server.url + "/v1/models", timeout=10).json()["data"]
    assert data[0]["id"] == MODEL   # then the adapters in load order; other tests' names are theirs
    assert [(m["id"], m["parent"], m["root"]) for m in data if m["id"] in ADAPTERS] == [
        ("ad-a", MODEL, str(adapters["ad-a"])), ("ad-b", "smol", str(adapters["ad-b"]))]
    response = httpx.post(lora_server.url + "/v1/chat/completions", timeout=30,
                          json={"model": "ad-z", "messages": MESSAGES[1:], "max_tokens": 4})
    error = response.json()["error"]
    assert response.status_code == 404 and error["code"] == "model_not_found"
    assert "ad-a" in error["message"] and "ad-b" in error["message"]


def test_prefix_cache_never_crosses_adapters(lora_server, adapters) -> None:
    a0, cached_a = chat(lora_server, "ad-a")
    assert cached_a == 0
    b0, cached_b = chat(lora_server, "ad-b")
    assert cached_b == 0
    b1, cached_b1 = chat(lora_server, "ad-b")
    assert (b1, cached_b1 > 0) == (b0, True)
    base, cached_base = chat(lora_server, MODEL)
    assert cached_base == 0 and len({a0, b0, base}) == 3
    reload = httpx.post(lora_server.url + "/v1/load_lora_adapter", timeout=60,
                        json={"lora_name": "ad-a", "lora_path": str(adapters["ad-c"]), "load_inplace": True})
    assert reload.status_code == 200
    c0, cached_c = chat(lora_server, "ad-a")
    assert cached_c == 0 and c0 != a0


def test_load_while_streaming_and_unload(lora_server, adapters) -> None:
    url = lora_server.url
    solo = {model: chat(lora_server, model, 32, MESSAGES[1:])[0] for model in (MODEL, "ad-b")}

    def stream(model: str) -> str:
        chunks = lora_server.client().chat.completions.create(
            model=model, messages=MESSAGES[1:], max_tokens=32, temperature=0, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = {pool.submit(stream, model): model for model in [MODEL] * 4 + ["ad-b"] * 4}
        loaded = httpx.post(url + "/v1/load_lora_adapter", timeout=60,
                            json={"lora_name": "ad-c", "lora_path": str(adapters["ad-c"])})
        assert loaded.status_code == 200
        assert chat(lora_server, "ad-c", 8, MESSAGES[1:])[0]
        for future, model in futures.items():
            assert future.result() == solo[model]
    bad = httpx.post(url + "/v1/load_lora_adapter", timeout=60, json={"lora_name": "bad", "lora_path": "/nonexistent"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_lora_adapter"
    assert httpx.post(url + "/v1/unload_lora_adapter", timeout=60, json={"lora_name": "nope"}).status_code == 404
    assert httpx.post(url + "/v1/unload_lora_adapter", timeout=60, json={"lora_name": "ad-c"}).status_code == 200
    ids = [m["id"] for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]]
    assert "ad-c" not in ids and "ad-b" in ids
    gone = httpx.post(url + "/v1/chat/completions", timeout=30,
                      json={"model": "ad-c", "messages": MESSAGES[1:], "max_tokens": 4})
    assert gone.status_code == 404
    assert chat(lora_server, "ad-b", 32, MESSAGES[1:])[0] == solo["ad-b"]

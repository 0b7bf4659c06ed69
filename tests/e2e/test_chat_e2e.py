"""Issue 2 end to end: the real server on SmolLM2 through the official `openai` client."""

from __future__ import annotations

import concurrent.futures
import re
import time

import httpx
import pytest

from tests.e2e.conftest import MODEL

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    match = re.search(rf"^structserve:{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_whole_and_streamed_chat_agree(server):
    client = server.client()
    whole = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    assert whole.object == "chat.completion" and whole.model == MODEL
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens > 10 and whole.usage.completion_tokens <= 24
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]


def test_n2_and_seed_reproducibility(server):
    client = server.client()
    kwargs = dict(model=MODEL, messages=QUESTION, max_tokens=16, temperature=1.0, seed=1234, n=2)
    first = client.chat.completions.create(**kwargs)
    second = client.chat.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in second.choices]
    stream = list(client.chat.completions.create(**kwargs, stream=True))
    by_index = {0: "", 1: ""}
    for chunk in stream:
        for choice in chunk.choices:
            by_index[choice.index] += choice.delta.content or ""
    assert [by_index[0], by_index[1]] == [c.message.content for c in first.choices]


def test_stop_string_is_cut(server):
    client = server.client()
    base = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    text = base.choices[0].message.content
    words = text.split()
    assert len(words) >= 3
    stop = words[2]
    cut = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index(stop)]


def test_logprobs(server):
    client = server.client()
    out = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0,
                                         logprobs=True, top_logprobs=3)
    entries = out.choices[0].logprobs.content
    ended_by_eos = out.choices[0].finish_reason == "stop"     # the end-of-turn token has no entry
    assert len(entries) == out.usage.completion_tokens - ended_by_eos
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert entry.token == entry.top_logprobs[0].token, "greedy picks the most likely token"


def test_completions_endpoint_prompt_forms(server):
    client = server.client()
    one = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert one.object == "text_completion" and one.choices[0].text
    ids = httpx.post(server.url + "/tokenize", json={"model": MODEL, "prompt": "The capital of France is"}).json()
    by_ids = client.completions.create(model=MODEL, prompt=ids["tokens"], max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == one.choices[0].text
    many = client.completions.create(model=MODEL, prompt=["One, two,", "Red, green,"], max_tokens=4, temperature=0)
    assert sorted(c.index for c in many.choices) == [0, 1]


def test_concurrent_streams_match_solo_greedy(server):
    client = server.client()   # float32 weights (the shared server): batching must not change greedy text
    prompts = [[{"role": "user", "content": f"Write one sentence about the number {i}."}] for i in range(16)]

    def run(messages, stream):
        if not stream:
            return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20,
                                                  temperature=0).choices[0].message.content
        chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0,
                                                stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    solo = [run(p, stream=False) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda p: run(p, stream=True), prompts))
    assert together == solo


def test_invalid_bodies_get_error_object(server):
    cases = [
        {"model": MODEL, "messages": QUESTION, "max_tokens": -1},
        {"model": MODEL, "messages": QUESTION, "temperature": "hot"},
        {"model": MODEL, "messages": "not a list"},
        {"model": MODEL},
        {"model": MODEL, "messages": QUESTION, "max_tokens": 10_000_000},
    ]
    for body in cases:
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "nope", "messages": QUESTION})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert httpx.get(server.url + "/health").status_code == 200


def test_disconnect_mid_stream_frees_blocks(server):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2000, "stream": True, "ignore_eos": True,
            "min_tokens": 2000, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        seen = 0
        lines = r.iter_lines()          # held: a dropped iterator closes the connection at once
        for line in lines:
            if line.startswith("data:"):
                seen += 1
            if seen >= 5:
                break
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and metric(server, "num_requests_running") < 1:
            time.sleep(0.1)
        assert metric(server, "num_requests_running") >= 1
        lines.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and metric(server, "num_requests_running") > 0:
        time.sleep(0.1)
    assert metric(server, "num_requests_running") == 0
    assert metric(server, "kv_cache_usage_perc") == 0.0

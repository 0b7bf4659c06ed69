"""Acceptance case 023 (../shared/cases): explicit null means the default, and malformed requests
are 400s with the OpenAI error object on /v1/chat/completions, /v1/completions and /v1/responses;
no rejected request reaches the engine. End to end on the real server.

The requests with explicit nulls go to the server in the session fixture `batch`
(tests/e2e/conftest.py) together with those of the other case files (`batch_jobs`); the rejections
are sent by their test to an otherwise idle server, so that the token counters can be compared.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.cases_support import (
    HELLO,
    HTTP,
    Jobs,
    case_body,
    chat_url,
    completions_url,
    counters,
    error_problems,
    parallel,
    post,
    responses_url,
    wait_idle,
)

pytestmark = pytest.mark.slow


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    return _jobs_023(server)


# --- 023 -----------------------------------------------------------------------------------------------

def test_case023_invalid_inputs_are_400_with_error_object(server):
    chat, cmpl, resp = chat_url(server), completions_url(server), responses_url(server)
    base = {"model": "default", "messages": HELLO, "max_tokens": 4}
    cbase = {"model": "default", "prompt": "test", "max_tokens": 4}
    rbase = {"model": "default", "input": "hello", "max_output_tokens": 4}
    checks: list[tuple[str, Any, str | None]] = []     # url, body, exact param
    for over, param in [({"max_tokens": -1}, "max_tokens"), ({"max_tokens": "ten"}, "max_tokens"),
                        ({"temperature": 2.5}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"n": 0}, "n")]:
        checks += [(chat, {**base, **over}, param), (cmpl, {**cbase, **over}, param)]
    checks += [(chat, {**base, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
               (cmpl, {**cbase, "logprobs": 21}, "logprobs"),
               (chat, {"model": "default", "max_tokens": 4}, "messages"),
               (chat, {**base, "messages": "hello"}, "messages"),
               (chat, {**base, "messages": {"role": "user", "content": "hello"}}, "messages"),
               (chat, {**base, "messages": None}, "messages"),
               (cmpl, {"model": "default", "max_tokens": 4}, "prompt"),
               (resp, {**rbase, "max_output_tokens": -1}, "max_output_tokens"),
               (resp, {**rbase, "max_output_tokens": "ten"}, "max_output_tokens"),
               (resp, {**rbase, "temperature": 2.5}, "temperature"),
               (resp, {**rbase, "top_p": 1.5}, "top_p"),
               (resp, {"model": "default", "max_output_tokens": 4}, "input")]
    raw_bodies = ['{"model": "default", "messages": [', "not json", "", "[1, 2]", "null",
                  '{"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,}']
    checks += [(url, raw, None) for url in (chat, cmpl, resp) for raw in raw_bodies]
    wait_idle(server.url)
    before = counters(server.url)
    responses = parallel(*[lambda c=c: post(c[0], c[1]) for c in checks])
    failures = {}
    for (url, body, param), r in zip(checks, responses, strict=True):
        problems = error_problems(r, 400)
        if param is not None and r.headers.get("content-type", "").startswith("application/json"):
            got = (r.json().get("error") or {}).get("param")
            if got != param:
                problems.append(f"param {got!r}, expected {param!r}")
        if problems:
            failures[f"{url.rsplit('/v1', 1)[1]} {str(body)[:100]}"] = problems
    assert not failures, failures
    client = server.client(timeout=600)
    for url, body, param in checks:     # the openai client raises BadRequestError for each
        if param is None:
            continue
        with pytest.raises(openai.BadRequestError) as err:
            client.post(url.split("/v1", 1)[1], body=body, cast_to=httpx.Response)
        assert err.value.body["param"] == param
    wait_idle(server.url)
    after = counters(server.url)
    for key in ("prompt_tokens_total", "generation_tokens_total", "kv_cache_usage_perc"):
        assert after[key] == before[key], f"{key} moved for rejected requests: {before[key]} -> {after[key]}"
    unknown = parallel(*[lambda u=u, b=b: post(u, {**b, "foo": 1}) for u, b in
                         ((chat, base), (chat, base), (cmpl, cbase), (cmpl, cbase), (resp, rbase), (resp, rbase))])
    for first, second in (unknown[0:2], unknown[2:4], unknown[4:6]):
        assert first.status_code == second.status_code and first.status_code in (200, 400), first.text
        if first.status_code == 400:
            assert not error_problems(first, 400) and first.json()["error"]["param"] == "foo", first.text
            assert first.json() == second.json()


def _stream_opens(url: str, body: dict[str, Any]) -> tuple[int, str | None]:
    """Stream `body`; (text deltas seen, finish_reason) after at most 21 deltas, then hang up."""
    with HTTP.stream("POST", url, json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200, r.read()
        tokens, finish = 0, None
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                tokens += bool(choice.get("text") or (choice.get("delta") or {}).get("content"))
                finish = choice["finish_reason"] or finish
            if finish or tokens > 20:
                break
        return tokens, finish


def _null_jobs_023(server) -> list[tuple[str, dict[str, Any]]]:
    chat, cmpl, resp = chat_url(server), completions_url(server), responses_url(server)
    body = case_body("023")
    base = {"model": "default", "messages": HELLO, "max_tokens": 1}
    jobs = [(chat, {**base, "max_tokens": None, "max_completion_tokens": 1}),
            (chat, {**base, "max_completion_tokens": None})]
    for name in ("temperature", "top_p", "stop", "seed", "tools", "n", "logprobs", "top_logprobs", "tool_choice",
                 "response_format", "stream_options", "presence_penalty", "frequency_penalty", "logit_bias",
                 "user", "parallel_tool_calls", "stream", "model"):
        jobs.append((chat, {**base, name: None}))
    for name in ("temperature", "top_p", "stop", "seed", "n", "logprobs", "echo", "suffix", "best_of",
                 "stream_options", "response_format", "user", "presence_penalty"):
        jobs.append((cmpl, {**body, "max_tokens": 1, name: None}))
    for name in ("temperature", "top_p", "tools", "tool_choice", "instructions", "text", "store", "metadata"):
        jobs.append((resp, {"model": "default", "input": "hello", "max_output_tokens": 1, name: None}))
    return jobs


def _jobs_023(server) -> dict[str, Callable[[], Any]]:
    body = case_body("023")
    long_chat = {"model": "default", "temperature": 0, "max_tokens": None, "max_completion_tokens": None,
                 "messages": [{"role": "user", "content": "Count from 1 to 100, one number per line."}]}
    jobs: dict[str, Callable[[], Any]] = {
        "023/case_stream": lambda: _stream_opens(completions_url(server), body),
        "023/chat_stream": lambda: _stream_opens(chat_url(server), long_chat),
    }
    for i, (url, b) in enumerate(_null_jobs_023(server)):
        jobs[f"023/null{i}"] = lambda u=url, b=b: post(u, b)
    return jobs


def test_case023_explicit_null_means_default(batch, server):
    """null for an optional parameter is its default on chat and completions (the Responses fields
    too). max_tokens null is no small cap: the exact case request (and chat with both token limits
    null) streams more than 16 tokens unless the model stops by itself; then the test hangs up."""
    assert case_body("023")["max_tokens"] is None
    for name in ("023/case_stream", "023/chat_stream"):
        tokens, finish = batch[name]
        assert finish == "stop" or (finish is None and tokens > 20), (name, tokens, finish)
    bad = []
    for i, (url, body) in enumerate(_null_jobs_023(server)):
        r = batch[f"023/null{i}"]
        if r.status_code != 200:
            bad.append((url.rsplit("/v1", 1)[1], body, r.status_code, r.text[:200]))
    assert not bad, bad

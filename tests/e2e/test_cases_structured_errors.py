"""Acceptance cases 008 and 009 (../shared/cases): a malformed response_format (or other nested
request shape) and a grammar that fails to compile are 400s naming the field, never a 500 and
never an unconstrained answer; nothing reaches the engine's generation. End to end on the real
server; every test sends its own requests to an otherwise idle server (the token counters are
compared).

One test per case (`test_caseNNN_...`) checks every statement of the case's `expected` list that
applies to /v1/chat/completions and /v1/completions; `test_caseNNN_neighbours_...` tests the rest
of the case's kind; `test_caseNNN_responses_variant` checks the case's "Responses variant"
statements on /v1/responses.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from typing import Any

import openai
import pytest

from tests.e2e.cases_support import (
    HELLO,
    HTTP,
    case_body,
    chat_url,
    completions_url,
    counters,
    error_problems,
    log_problems,
    metric,
    poll_until,
    post,
    post_sse,
    responses_url,
    wait_idle,
)

pytestmark = pytest.mark.slow


# --- 008 -----------------------------------------------------------------------------------------------

def run_rejections(server, cases: list[tuple[str, Any, str | None, str | None]],
                   valid: dict[str, dict[str, Any]], engine_may_see: bool = False) -> dict[str, list[str]]:
    """Send each (url, bad body, param prefix, message mention) followed by a valid request to the
    same endpoint; check the 400s, the 200s, and that the token counters moved only by the valid
    requests' usage: nothing was generated for a rejected request, nor (unless `engine_may_see`,
    for faults only the engine's grammar compile finds) even queued in the engine."""
    wait_idle(server.url)
    before = counters(server.url)

    def one(case):
        url, bad, prefix, mention = case
        problems = error_problems(post(url, bad), 400, prefix, mention)
        ok = post(url, valid[url])
        return problems, ok

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, cases))
    wait_idle(server.url)
    after = counters(server.url)
    failures = {f"{url} {json.dumps(bad)[:160]}": problems
                for (url, bad, _, _), (problems, _) in zip(cases, results, strict=True) if problems}
    oks = [ok for _, ok in results]
    assert all(ok.status_code == 200 for ok in oks), [ok.text for ok in oks if ok.status_code != 200][:3]
    usages = [ok.json()["usage"] for ok in oks]
    prompt = sum(u.get("prompt_tokens", u.get("input_tokens")) for u in usages)
    generated = sum(u.get("completion_tokens", u.get("output_tokens")) for u in usages)
    if not engine_may_see:
        assert after["prompt_tokens_total"] - before["prompt_tokens_total"] == prompt, \
            "a rejected request reached the engine"
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == generated, \
        "a rejected request generated tokens"
    assert after["kv_cache_usage_perc"] == before["kv_cache_usage_perc"]
    return failures


def _valid(server) -> dict[str, dict[str, Any]]:
    return {chat_url(server): {"model": "default", "messages": HELLO, "max_tokens": 1},
            completions_url(server): {"model": "default", "prompt": "hello", "max_tokens": 1},
            responses_url(server): {"model": "default", "input": "hello", "max_output_tokens": 1}}


def test_case008_malformed_response_format_is_400(server):
    body = case_body("008", max_tokens=4)
    shapes = [body["response_format"], {"type": "json_schema"},
              {"type": "json_schema", "json_schema": {"name": "x", "schema": "a string"}}, {"type": "yaml"}]
    cases = []
    for shape in shapes:
        cases.append((chat_url(server), {**body, "response_format": shape}, "response_format", "json_schema"))
        cases.append((completions_url(server), {"model": "default", "prompt": "hello", "max_tokens": 4,
                                                "response_format": shape}, "response_format", "json_schema"))
    failures = run_rejections(server, cases, _valid(server))
    assert not failures, failures
    client = server.client(timeout=600)
    for shape in shapes:
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="default", messages=HELLO, max_tokens=4, response_format=shape)
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="default", prompt="hello", max_tokens=4,
                                      extra_body={"response_format": shape})


def test_case008_neighbours_other_malformed_shapes_are_400(server):
    """The same kind for every other nested request shape: never a 500, a 400 naming the field."""
    chat, cmpl = chat_url(server), completions_url(server)
    base = {"model": "default", "messages": HELLO, "max_tokens": 4}
    fn = {"type": "function", "function": {"name": "f"}}
    chat_cases = [
        ({"response_format": "json_object"}, "response_format"),
        ({"response_format": {}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": None}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                                                     "strict": "yes"}}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": ["object"]}}},
         "response_format"),
        ({"structured_outputs": {"json": 5}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"foo": 1}}, "structured_outputs"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]}, "tools"),
        ({"tools": [fn], "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tools": [fn], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [fn], "tool_choice": "required",
          "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
         "response_format"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({"stream_options": "yes"}, "stream_options"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"stop": ["a", 5]}, "stop"),
    ]
    cases = [(chat, {**base, **over}, prefix, None) for over, prefix in chat_cases]
    cases += [(cmpl, {"model": "default", "prompt": "hello", "max_tokens": 4, **over}, prefix, None) for over, prefix in [
        ({"structured_outputs": {"json": 5}}, "structured_outputs"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        ({"prompt": [[1, 2], "mixed"]}, "prompt"),
        ({"stream_options": 3}, "stream_options"),
    ]]
    failures = run_rejections(server, cases, _valid(server))
    assert not failures, failures


def test_case008_responses_variant(server):
    shapes = [{"type": "json_schema"}, {"type": "json_schema", "name": "x"},
              {"type": "json_schema", "name": "x", "schema": "a string"}, {"type": "yaml"}]
    url = responses_url(server)
    cases = [(url, {"model": "default", "input": "hello", "max_output_tokens": 4, "text": {"format": shape}},
              "text", None) for shape in shapes]
    failures = run_rejections(server, cases, _valid(server))
    assert not failures, failures
    client = server.client(timeout=600)
    for shape in shapes:
        with pytest.raises(openai.BadRequestError):
            client.responses.create(model="default", input="hello", max_output_tokens=4, text={"format": shape})


# --- 009 -----------------------------------------------------------------------------------------------

def _with_schema(body: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    rf = json.loads(json.dumps(body["response_format"]))
    rf["json_schema"]["schema"] = schema
    return {**body, "response_format": rf}


def test_case009_schema_compile_failure_fails_closed(server):
    body = case_body("009")
    schema = body["response_format"]["json_schema"]["schema"]
    bad = [
        (schema, "^(hello|hi"),
        ({**schema, "properties": {"greeting": {"type": "notatype"}}}, "greeting"),
        ({**schema, "properties": {"greeting": {"$ref": "#/$defs/missing"}}}, "missing"),
    ]
    plain = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    runner = {"model": "default", "messages": [{"role": "user", "content": "Write about the sea."}],
              "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": True}
    wait_idle(server.url)
    start = time.monotonic()
    assert post(chat_url(server), plain).status_code == 200
    normal_latency = time.monotonic() - start
    solo = post_sse(chat_url(server), runner)
    assert solo.status == 200 and not solo.problems
    wait_idle(server.url)
    before = counters(server.url)
    offset = len(server.log())
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        running = pool.submit(post_sse, chat_url(server), runner)
        assert poll_until(lambda: metric(server.url, "generation_tokens_total") > before["generation_tokens_total"],
                          60) is not None, "the running request never started"
        rejected = list(pool.map(lambda job: (job, post(chat_url(server), {**_with_schema(body, job[0]),
                                                                             "stream": job[2]})),
                                 [(s, mention, stream) for s, mention in bad for stream in (False, True)]))
        concurrent_run = running.result()
    for (s, mention, stream), resp in rejected:
        problems = error_problems(resp, 400, "response_format", mention)
        assert not problems, (stream, s, problems)
        assert not resp.headers.get("content-type", "").startswith("text/event-stream")
    assert concurrent_run.status == 200 and not concurrent_run.problems, concurrent_run.problems
    assert concurrent_run.content() == solo.content() and concurrent_run.finish_reasons() == ["length"]
    wait_idle(server.url)
    after = counters(server.url)
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == runner["max_tokens"], \
        "tokens were generated for a rejected schema"
    assert after["kv_cache_usage_perc"] == before["kv_cache_usage_perc"], "KV blocks leaked"
    start = time.monotonic()
    assert post(chat_url(server), plain).status_code == 200
    assert time.monotonic() - start <= normal_latency + 2.0, "the server is slower after the bad schemas"
    assert server.proc.poll() is None and HTTP.get(server.url + "/health").status_code == 200
    assert not log_problems(server.log()[offset:]), log_problems(server.log()[offset:])


def test_case009_neighbours_other_compile_errors_and_paths(server):
    """Other grammar-compile failures (backreference, empty enum, unsatisfiable bounds, malformed
    schema) and the other routes to a grammar (completions, structured_outputs, tool parameters,
    EBNF) are 400s naming their field; nothing is generated."""
    chat, cmpl = chat_url(server), completions_url(server)
    base = {"model": "default", "messages": HELLO, "max_tokens": 16}
    bad_pattern = {"type": "object", "properties": {"g": {"type": "string", "pattern": "^(hello|hi"}},
                   "required": ["g"]}

    def rf(schema):
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}

    schemas = [{"type": "string", "pattern": "(a)\\1"}, {"enum": []}, {"type": "string", "minLength": 5, "maxLength": 2},
               {"type": "integer", "minimum": 5, "maximum": 2}, {"type": "object", "properties": "notadict"},
               {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1},
               {"type": "object", "required": ["x"], "additionalProperties": False}]
    cases = [(chat, {**base, "response_format": rf(s), "stream": stream}, "response_format", None)
             for s in schemas for stream in (False, True)]
    tool = {"type": "function", "function": {"name": "f", "parameters": bad_pattern}}
    cases += [
        (cmpl, {"model": "default", "prompt": "hi", "max_tokens": 8, "response_format": rf(bad_pattern)},
         "response_format", "^(hello|hi"),
        (cmpl, {"model": "default", "prompt": "hi", "max_tokens": 8, "stream": True,
                "response_format": rf(bad_pattern)}, "response_format", "^(hello|hi"),
        (chat, {**base, "structured_outputs": {"json": bad_pattern}}, "structured_outputs", "^(hello|hi"),
        (chat, {**base, "structured_outputs": {"regex": "([a-z"}}, "structured_outputs", None),
        (cmpl, {"model": "default", "prompt": "hi", "max_tokens": 8, "structured_outputs": {"grammar": "root ::= foo"}},
         "structured_outputs", None),
        (chat, {**base, "tools": [tool], "tool_choice": "required"}, "tools", "^(hello|hi"),
        (chat, {**base, "tools": [tool], "tool_choice": "auto", "stream": True}, "tools", "^(hello|hi"),
        (chat, {**base, "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools",
         "^(hello|hi"),
    ]
    failures = run_rejections(server, cases, _valid(server), engine_may_see=True)
    assert not failures, failures

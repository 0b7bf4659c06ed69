"""Acceptance cases 011, 012 and 014 (../shared/cases): a json_schema response_format is applied on
every path, keywords a backend cannot enforce are refused (never silently dropped), and output cut
by max_tokens reports "length" and is a prefix of a valid document. End to end on the real server.

One test per case (`test_caseNNN_...`) checks every statement of the case's `expected` list that
applies to /v1/chat/completions and /v1/completions; `test_caseNNN_neighbours_...` tests the rest
of the case's kind; `test_caseNNN_responses_variant` checks the case's "Responses variant"
statements on /v1/responses.

The requests go to the server in the session fixture `batch` (tests/e2e/conftest.py) together with
those of the other case files; `batch_jobs` lists this file's, the tests only read the results.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import pytest

from tests.e2e.cases_json import json_prefix_problems, longest_whitespace_run_outside_strings
from tests.e2e.cases_support import (
    Jobs,
    case_body,
    chat_url,
    completions_url,
    error_problems,
    message_calls,
    post,
    post_sse,
    sdk_stream,
    validator,
)

pytestmark = pytest.mark.slow


# started first in the shared batch (100-500 tokens each): cases_support.collected_batch_jobs
LONG_JOBS = ("012/guidance", "012/auto", "011/json_object", "014/big")


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    return {**_jobs_011(server), **_jobs_014(server), **_jobs_012(server)}


# --- 011 -----------------------------------------------------------------------------------------------

def check_schema_output(content: str | None, finish: str | None, schema: dict[str, Any]) -> None:
    """stop: the unmodified content is one JSON document valid against the schema; length: it is a
    prefix of one."""
    content = content or ""
    if finish == "stop":
        value = json.loads(content)    # no fence, no prose: only JSON whitespace around the value
        validator(schema).validate(value)
    else:
        assert finish == "length", finish
        problems = json_prefix_problems(content, schema)
        assert not problems, (content, problems)


SMALL = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9},
                                          "word": {"type": "string", "maxLength": 8}},
         "required": ["ok", "n", "word"], "additionalProperties": False}


def _jobs_011(server) -> dict[str, Callable[[], Any]]:
    client = server.client(timeout=600)
    body = case_body("011")
    json_object = {**body, "response_format": {"type": "json_object"}, "max_tokens": 120}
    text = {**body, "response_format": {"type": "text"}, "max_tokens": 40}
    free = {k: v for k, v in text.items() if k != "response_format"}
    rf = {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL, "strict": True}}
    common = {"model": "default", "max_tokens": 60, "temperature": 0.8, "seed": 3,
              "messages": [{"role": "user", "content": "Give me a small JSON object."}]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}}]
    cbody = {"model": "default", "prompt": "A small JSON object:", "max_tokens": 60, "temperature": 0.8, "seed": 3,
             "response_format": rf}
    return {
        "011/whole": lambda: client.chat.completions.create(**body),
        "011/stream": lambda: sdk_stream(client, **body),
        "011/json_object": lambda: client.chat.completions.create(**json_object),
        "011/text": lambda: client.chat.completions.create(**text),
        "011/free": lambda: client.chat.completions.create(**free),
        "011n/logprobs": lambda: client.chat.completions.create(**common, response_format=rf, logprobs=True,
                                                                top_logprobs=2),
        "011n/n2": lambda: client.chat.completions.create(**common, response_format=rf, n=2),
        "011n/n2_stream": lambda: sdk_stream(client, **common, response_format=rf, n=2),
        "011n/structured_outputs": lambda: client.chat.completions.create(
            **common, extra_body={"structured_outputs": {"json": SMALL}}),
        "011n/tools_none": lambda: client.chat.completions.create(**common, response_format=rf, tools=tools,
                                                                  tool_choice="none"),
        "011n/tools_auto": lambda: client.chat.completions.create(**common, response_format=rf, tools=tools),
        "011n/completions": lambda: post(completions_url(server), cbody),
        "011n/completions_stream": lambda: post_sse(completions_url(server), {**cbody, "stream": True}),
    }


def test_case011_json_schema_is_applied(batch):
    body = case_body("011")
    schema = body["response_format"]["json_schema"]["schema"]
    whole, streamed = batch["011/whole"], batch["011/stream"]
    check_schema_output(whole.choices[0].message.content, whole.choices[0].finish_reason, schema)
    assert len(streamed["finish"][0]) == 1
    check_schema_output(streamed["content"][0], streamed["finish"][0][0], schema)
    assert "JSON" in body["messages"][0]["content"]
    obj = batch["011/json_object"].choices[0]
    if obj.finish_reason == "stop":
        assert isinstance(json.loads(obj.message.content), dict), obj.message.content
    else:
        content = obj.message.content
        assert content.lstrip().startswith("{") and not json_prefix_problems(content, {"type": "object"}), content
    assert batch["011/text"].choices[0].message.content == batch["011/free"].choices[0].message.content, \
        'response_format {"type": "text"} changed the output'


def test_case011_neighbours_constraint_holds_on_every_path(batch):
    """logprobs (no jump-forward), n=2 streamed and whole, /v1/completions whole and streamed,
    structured_outputs.json, tools with tool_choice none, and tools with auto (answer or calls)."""
    outputs = []
    for name in ("logprobs", "n2", "structured_outputs", "tools_none"):
        outputs += [(name, c.message.content, c.finish_reason) for c in batch[f"011n/{name}"].choices]
    stream = batch["011n/n2_stream"]
    outputs += [("n2_stream", stream["content"][i], stream["finish"][i][-1]) for i in (0, 1)]
    auto = batch["011n/tools_auto"].choices[0]
    if auto.message.tool_calls:
        for name, arguments in message_calls(auto.message):
            assert name == "get_weather" and isinstance(arguments.get("city"), str), arguments
    else:
        outputs.append(("tools_auto", auto.message.content, auto.finish_reason))
    cmpl = batch["011n/completions"]
    assert cmpl.status_code == 200, cmpl.text
    outputs += [("completions", c["text"], c["finish_reason"]) for c in cmpl.json()["choices"]]
    cs = batch["011n/completions_stream"]
    assert cs.status == 200 and not cs.problems, cs.problems
    text = "".join(c["text"] for chunk in cs.chunks for c in chunk["choices"])
    outputs.append(("completions_stream", text, cs.finish_reasons()[-1]))
    bad = []
    for name, content, finish in outputs:
        try:
            check_schema_output(content, finish, SMALL)
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            bad.append((name, content, finish, str(exc)[:200]))
    assert not bad, bad


# --- 012 -----------------------------------------------------------------------------------------------

def check_rejected_or_enforced(resp: httpx.Response, schema: dict[str, Any], keywords: list[str]) -> str:
    """400 naming every keyword, or 200 whose output validates (stop) / is a valid prefix (length) and
    never degenerates into whitespace. Returns "400" or the finish_reason."""
    if resp.status_code == 400:
        problems = error_problems(resp, 400, "response_format")
        problems += [f"message does not name {k!r}" for k in keywords if k not in resp.json()["error"]["message"]]
        assert not problems, (problems, resp.text)
        return "400"
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    content, finish = choice["message"]["content"] or "", choice["finish_reason"]
    assert longest_whitespace_run_outside_strings(content) <= 16, f"whitespace run in {content!r}"
    assert content.strip() not in ("", "{"), f"degenerate output {content!r} ({finish})"
    if finish == "stop":
        validator(schema).validate(json.loads(content))
    else:
        assert finish == "length" and not json_prefix_problems(content, schema), (content, finish)
    return finish


_BACKENDS_012 = (None, "xgrammar", "guidance")
_ARR = {"type": "array", "items": {"type": "integer"}}
_OBJ = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
NEIGHBOURS_012 = [   # (backend, schema, keywords the error must name)
    (None, {**_ARR, "uniqueItems": True, "minItems": 2}, ["uniqueItems"]),
    (None, {**_ARR, "contains": {"const": 7}}, ["contains"]),
    (None, {"type": "integer", "not": {"const": 0}}, ["not"]),
    (None, {**_OBJ, "if": {"required": ["a"]}, "then": {"required": ["b"]}}, ["if", "then"]),
    (None, {**_OBJ, "propertyNames": {"pattern": "^a"}}, ["propertyNames"]),
    (None, {**_OBJ, "dependentRequired": {"a": ["b"]}}, ["dependentRequired"]),
    (None, {**_OBJ, "unevaluatedProperties": False}, ["unevaluatedProperties"]),
    (None, {"type": "string", "format": "credit-card"}, ["format"]),
    ("xgrammar", {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}, ["maxLength"]),
    ("xgrammar", {"type": "number", "multipleOf": 0.5}, ["multipleOf"]),
    ("xgrammar", {"allOf": [{"type": "integer", "minimum": 3}, {"type": "integer", "maximum": 5}]}, ["allOf"]),
    ("xgrammar", {"type": "object", "properties": {"a": {"type": "integer"}},
                  "patternProperties": {"^s": {"type": "integer"}}}, ["patternProperties"]),
    # regex lookaround: a backend that drops the assertion accepts strings the pattern rejects
    (None, {"type": "string", "pattern": "(?=b)abc"}, ["pattern"]),
    (None, {"type": "string", "pattern": "(?!a)abc"}, ["pattern"]),
    ("xgrammar", {"type": "string", "pattern": "^(?=[0-9])[a-z0-9]{4}$"}, ["pattern"]),
]


def _jobs_012(server) -> dict[str, Callable[[], Any]]:
    body = case_body("012")

    def rf_body(schema, backend=None):
        b = {"model": "default", "max_tokens": 40, "temperature": 0,
             "messages": [{"role": "user", "content": "Answer in JSON."}],
             "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        return b if backend is None else {**b, "structured_outputs": {"backend": backend}}

    jobs = {f"012/{b or 'auto'}": (lambda b=b: post(chat_url(server), body if b is None else
                                                    {**body, "structured_outputs": {"backend": b}}))
            for b in _BACKENDS_012}
    for i, (backend, schema, _) in enumerate(NEIGHBOURS_012):
        jobs[f"012n/{i}"] = lambda s=schema, b=backend: post(chat_url(server), rf_body(s, b))
    return jobs


def test_case012_unsupported_keyword_rejected_or_enforced(batch):
    schema = case_body("012")["response_format"]["json_schema"]["schema"]
    for backend in _BACKENDS_012:
        check_rejected_or_enforced(batch[f"012/{backend or 'auto'}"], schema, ["patternProperties"])


def test_case012_neighbours_other_unenforceable_keywords(batch):
    """Keywords no backend (or xgrammar) enforces are refused by name, or enforced: never silently
    weakened. Includes regex lookaround in `pattern`, which a backend may skip."""
    bad = []
    for i, (backend, schema, keywords) in enumerate(NEIGHBOURS_012):
        resp = batch[f"012n/{i}"]
        try:
            check_rejected_or_enforced(resp, schema, keywords)
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            bad.append((backend or "auto", schema, resp.status_code, resp.text[:200], str(exc)[:200]))
    assert not bad, bad


# --- 014 -----------------------------------------------------------------------------------------------

def _jobs_014(server) -> dict[str, Callable[[], Any]]:
    client = server.client(timeout=600)
    body = case_body("014", temperature=0)
    schema = body["response_format"]["json_schema"]["schema"]
    free = {k: v for k, v in body.items() if k != "response_format"}
    tool = {"type": "function", "function": {"name": "describe", "parameters": schema}}
    fmt = {"type": "json_schema", "name": "person", "schema": schema}
    responses = {"model": "default", "input": body["messages"][0]["content"], "max_output_tokens": 6,
                 "text": {"format": fmt}}
    return {
        "014/whole": lambda: client.chat.completions.create(**body),
        "014/stream": lambda: sdk_stream(client, **body, stream_options={"include_usage": True}),
        "014/big": lambda: client.chat.completions.create(**{**body, "max_tokens": 512}),
        "014n/n2": lambda: client.chat.completions.create(**{**body, "n": 2, "temperature": 0.9, "seed": 2}),
        "014n/one": lambda: client.chat.completions.create(**{**body, "max_tokens": 1}),
        "014n/json_object": lambda: client.chat.completions.create(
            **{**body, "max_tokens": 5, "response_format": {"type": "json_object"}}),
        "014n/regex": lambda: client.chat.completions.create(**free,
                                                             extra_body={"structured_outputs": {"regex": "[a-z]{30}"}}),
        "014n/choice": lambda: client.chat.completions.create(
            **{**free, "max_tokens": 2},
            extra_body={"structured_outputs": {"choice": ["alpha beta gamma delta epsilon zeta eta theta"]}}),
        "014n/completions": lambda: client.completions.create(
            model="default", prompt="A person:", max_tokens=6, temperature=0,
            extra_body={"response_format": body["response_format"]}),
        "014n/tool": lambda: client.chat.completions.create(**free, tools=[tool], tool_choice="required"),
        "014n/tool_stream": lambda: sdk_stream(client, **free, tools=[tool], tool_choice="required"),
        "014r/whole": lambda: client.responses.create(**responses),
        "014r/stream": lambda: [event.type for event in client.responses.create(**responses, stream=True)],
    }


def test_case014_truncated_json_reports_length(batch):
    schema = case_body("014")["response_format"]["json_schema"]["schema"]
    whole, streamed, big = batch["014/whole"], batch["014/stream"], batch["014/big"]
    choice = whole.choices[0]
    check_schema_output(choice.message.content, choice.finish_reason, schema)
    assert choice.finish_reason == "length", "6 tokens cannot hold a complete person document"
    assert whole.usage.completion_tokens == 6
    assert streamed["finish"][0] == ["length"]
    assert streamed["content"][0] == choice.message.content
    assert streamed["usage"].completion_tokens == 6
    check_schema_output(big.choices[0].message.content, big.choices[0].finish_reason, schema)
    if big.choices[0].finish_reason == "length":
        assert big.usage.completion_tokens == 512


def test_case014_neighbours_truncation_on_other_paths(batch):
    """n=2, /v1/completions, json_object, regex, choice, max_tokens 1 and a forced tool call cut by
    max_tokens all finish with "length" and never return a broken document as a normal stop."""
    schema = case_body("014")["response_format"]["json_schema"]["schema"]
    for c in batch["014n/n2"].choices:
        assert c.finish_reason == "length", c
        check_schema_output(c.message.content, c.finish_reason, schema)
    one = batch["014n/one"]
    assert one.choices[0].finish_reason == "length" and one.usage.completion_tokens == 1
    obj = batch["014n/json_object"].choices[0]
    assert obj.finish_reason == "length" and not json_prefix_problems(obj.message.content, {"type": "object"})
    regex = batch["014n/regex"].choices[0]
    assert regex.finish_reason == "length" and re.fullmatch("[a-z]{0,29}", regex.message.content), regex
    assert batch["014n/choice"].choices[0].finish_reason == "length"
    cmpl = batch["014n/completions"].choices[0]
    assert cmpl.finish_reason == "length"
    check_schema_output(cmpl.text, "length", schema)
    tool = batch["014n/tool"].choices[0]
    assert tool.finish_reason == "length", (tool.finish_reason, tool.message)
    assert not tool.message.tool_calls, "a call cut by max_tokens came back as a complete call"
    streamed = batch["014n/tool_stream"]
    assert streamed["finish"][0] == ["length"] and not streamed["calls"].get(0), streamed


def test_case014_responses_variant(batch):
    schema = case_body("014")["response_format"]["json_schema"]["schema"]
    response, events = batch["014r/whole"], batch["014r/stream"]
    assert response.status == "incomplete", response.status
    assert response.incomplete_details and response.incomplete_details.reason == "max_output_tokens"
    assert events[-1] == "response.incomplete" and "response.completed" not in events, events
    assert not json_prefix_problems(response.output_text, schema), response.output_text

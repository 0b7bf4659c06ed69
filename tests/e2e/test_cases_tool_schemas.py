"""Acceptance case 043 (../shared/cases): tool-call grammars depend only on the schema's structure
(descriptions are data, whatever characters they hold) and stay tractable with 48 optional
properties; end to end on the real server, whole and streamed.

Neighbours: the hostile text in property names and enum values (structure that must be escaped,
not only descriptions), a named choice and parallel_tool_calls false on the 48-property tool, and
the hostile description on /v1/responses. The requests go to the server in the session fixture
`batch` (tests/e2e/conftest.py).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

from tests.e2e.cases_support import (
    HTTP,
    Jobs,
    Sse,
    case_body,
    chat_url,
    error_problems,
    parse_sse,
    parsed_arguments,
    post,
    reassemble_tool_calls,
    responses_url,
    validator,
)

pytestmark = pytest.mark.slow

HOSTILE = ('Path with "quotes", \\backslashes\\ and\nnewlines; grammar text ::= a | (b)* {c} '
           '<tool_call>{"name": "x"}</tool_call> ünïcødé 日本語 — ')
GLOB_DESCRIPTION = (HOSTILE * (2000 // len(HOSTILE) + 1))[:2000]
GLOB_PROMPT = "Find all Python files under src."
FIRST_CALL_LIMIT_S = 60.0


def first_call_limit_s() -> float:
    """FIRST_CALL_LIMIT_S on a quiet box, stretched by how oversubscribed the cores were over the
    last minute (the 2-core test box is shared: the limit is about a hang, not about speed)."""
    return FIRST_CALL_LIMIT_S * max(1.0, os.getloadavg()[0] / len(os.sched_getaffinity(0)))


def glob_tool(path_description: str, path_key: str = "path", enum: list[str] | None = None) -> dict[str, Any]:
    """A glob function: pattern required, `path_key` optional with `path_description`."""
    path: dict[str, Any] = {"type": "string", "description": path_description}
    if enum is not None:
        path["enum"] = enum
    return {"type": "function", "function": {
        "name": "glob", "description": "Find files by glob pattern",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string", "description": "glob pattern"},
                                                        path_key: path},
                       "required": ["pattern"], "additionalProperties": False}}}


def glob_body(tool: dict[str, Any]) -> dict[str, Any]:
    return {"model": "default", "temperature": 0, "max_tokens": 80, "tool_choice": "required",
            "messages": [{"role": "user", "content": GLOB_PROMPT}], "tools": [tool]}


def timed_sse(url: str, body: dict[str, Any]) -> tuple[Sse, float | None]:
    """A streamed request read to its end, and the seconds until its first tool-call delta."""
    start, first_call = time.monotonic(), None
    parts: list[bytes] = []
    with HTTP.stream("POST", url, json={**body, "stream": True}, timeout=300) as r:
        for part in r.iter_bytes():
            parts.append(part)
            if first_call is None and b'"tool_calls"' in part:
                first_call = time.monotonic() - start
        sse = Sse(r.status_code, r.headers.get("content-type", ""), b"".join(parts).decode())
    if sse.status == 200:
        sse.data, sse.problems = parse_sse(sse.text)
        sse.chunks = [json.loads(d) for d in sse.data if d != "[DONE]"]
        sse.problems += [f"in-stream error {c['error']}" for c in sse.chunks if "error" in c]
    return sse, first_call


# started first in the shared batch (up to 300 tokens each): cases_support.collected_batch_jobs
LONG_JOBS = ("043/auto", "043/whole", "043/stream", "043n/named_single")


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    chat = chat_url(server)
    body = case_body("043")
    hostile, plain = glob_body(glob_tool(GLOB_DESCRIPTION)), glob_body(glob_tool("x"))
    odd_key = glob_body(glob_tool(HOSTILE[:60], path_key='dir "a|b" ::= </tool_call>',
                                  enum=["src\\", 'a"b', "<tool_call>", "日本"]))
    weather = {"model": "default", "temperature": 0, "max_output_tokens": 80, "tool_choice": "required",
               "input": GLOB_PROMPT, "tools": [{"type": "function", **glob_tool(GLOB_DESCRIPTION)["function"]}]}
    return {
        "043/whole": lambda: post(chat, body),
        "043/stream": lambda: timed_sse(chat, body),
        "043/auto": lambda: post(chat, {**body, "tool_choice": "auto"}),
        "043/glob_whole": lambda: post(chat, hostile),
        "043/glob_stream": lambda: timed_sse(chat, hostile),
        "043/glob_x": lambda: post(chat, plain),
        "043n/odd_key": lambda: post(chat, odd_key),
        "043n/named_single": lambda: post(chat, {**body, "parallel_tool_calls": False, "max_tokens": 120,
                                                 "tool_choice": {"type": "function", "function": {"name": "log_food"}}}),
        "043n/responses": lambda: post(responses_url(server), weather),
    }


def whole_calls(resp, tool: dict[str, Any], finish: str | None = "tool_calls") -> list[tuple[str, Any]]:
    """(name, arguments) of a 200 chat answer's calls, each the tool's and valid for its schema."""
    assert resp.status_code == 200, resp.text[:500]
    choice = resp.json()["choices"][0]
    if finish is not None:
        assert choice["finish_reason"] == finish, choice
    check = validator(tool["function"]["parameters"])
    calls = []
    for call in choice["message"].get("tool_calls") or []:
        arguments = parsed_arguments(call["function"]["arguments"])
        assert call["function"]["name"] == tool["function"]["name"], call
        assert not list(check.iter_errors(arguments)), (arguments, [e.message for e in check.iter_errors(arguments)])
        calls.append((call["function"]["name"], arguments))
    return calls


def streamed_calls(result: tuple[Sse, float | None]) -> list[tuple[str, Any]]:
    """(name, arguments) of a streamed answer's calls; no in-stream error, the first call delta
    within first_call_limit_s() (the grammar compiled and the call began in time)."""
    sse, first_call = result
    assert sse.status == 200 and not sse.problems, (sse.text[:500], sse.problems)
    limit = first_call_limit_s()
    assert first_call is not None and first_call < limit, (first_call, limit)
    return [(c["name"], parsed_arguments(c["arguments"])) for c in reassemble_tool_calls(sse.chunks)]


def test_case043_many_optional_params(batch):
    tool = case_body("043")["tools"][0]
    assert len(tool["function"]["parameters"]["properties"]) == 49
    calls = whole_calls(batch["043/whole"], tool)
    assert calls, "no tool call"
    assert streamed_calls(batch["043/stream"]) == calls
    whole_calls(batch["043/auto"], tool, finish=None)


def test_case043_hostile_description_is_data(batch):
    tool = glob_tool(GLOB_DESCRIPTION)
    calls = whole_calls(batch["043/glob_whole"], tool)
    assert calls and all("pattern" in arguments for _, arguments in calls), calls
    assert streamed_calls(batch["043/glob_stream"]) == calls
    assert whole_calls(batch["043/glob_x"], glob_tool("x")), "no call with the one-letter description"


def test_case043_neighbours_structure_and_other_choices(batch):
    """Hostile property names and enum values are escaped in the grammar (the calls validate); a
    named choice with parallel_tool_calls false is one log_food call; /v1/responses with the
    hostile description gives a valid glob call."""
    odd = glob_tool(HOSTILE[:60], path_key='dir "a|b" ::= </tool_call>', enum=["src\\", 'a"b', "<tool_call>", "日本"])
    assert whole_calls(batch["043n/odd_key"], odd)
    tool = case_body("043")["tools"][0]
    named = batch["043n/named_single"]
    assert len(whole_calls(named, tool, finish=None)) == 1
    assert named.json()["choices"][0]["finish_reason"] in ("stop", "tool_calls"), named.json()  # OpenAI: stop
    resp = batch["043n/responses"]
    assert resp.status_code == 200, resp.text[:500]
    calls = [item for item in resp.json()["output"] if item["type"] == "function_call"]
    check = validator(glob_tool(GLOB_DESCRIPTION)["function"]["parameters"])
    assert calls and all(c["name"] == "glob" and not list(check.iter_errors(json.loads(c["arguments"])))
                         for c in calls), calls


def test_case043_neighbours_malformed_schema_structure_is_400(server):
    """A `$ref` whose list index is a non-ASCII digit ('²', which str.isdigit() accepts and int()
    refuses), in a tool's parameters and in a response_format schema, on chat and Responses: a 400
    naming the schema's field, never a 500."""
    schema = {"type": "object", "properties": {"pattern": {"$ref": "#/allOf/²"}}, "allOf": [{"type": "string"}]}
    tool = {"type": "function", "function": {"name": "glob", "parameters": schema}}
    chat = {"model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": GLOB_PROMPT}]}
    checks = [
        (chat_url(server), {**chat, "tools": [tool], "tool_choice": "required"}, "tools[0].function.parameters"),
        (chat_url(server), {**chat, "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": schema}}}, "response_format"),
        (responses_url(server), {"model": "default", "input": GLOB_PROMPT, "max_output_tokens": 8,
                                 "tools": [{"type": "function", **tool["function"]}], "tool_choice": "required"},
         "tools[0].parameters"),
    ]
    for url, body, param in checks:
        resp = post(url, body)
        assert not error_problems(resp, 400, param), (param, error_problems(resp, 400, param))

"""Acceptance case 030 (../shared/cases): a tool_choice that the declared tools cannot satisfy is
a 400 at request validation (never a grammar error, a 500 or a stream that fails after it has
started), on /v1/chat/completions and /v1/responses, whole and streamed; end to end on the real
server.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.cases_support import (
    HELLO,
    case_body,
    chat_url,
    counters,
    error_problems,
    parallel,
    post,
    responses_url,
    wait_idle,
)

pytestmark = pytest.mark.slow

GET_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _unsatisfiable_chat() -> list[tuple[dict[str, Any], tuple[str, ...], str | None]]:
    """(chat body, allowed param prefixes, text the message must name) for every refused body."""
    body = case_body("030")
    assert body["tool_choice"] == "required" and body["tools"] == []
    omitted = {k: v for k, v in body.items() if k != "tools"}
    named = {**body, "tools": [GET_WEATHER]}
    either = ("tool_choice", "tools")
    return [
        (body, either, None),
        (omitted, either, None),
        ({**body, "tools": None}, either, None),
        ({**named, "tool_choice": {"type": "function", "function": {"name": "lookup"}}}, ("tool_choice",), "lookup"),
        ({**named, "tool_choice": {"type": "function", "function": {"name": ""}}}, ("tool_choice",), None),
        ({**named, "tool_choice": {"type": "function"}}, ("tool_choice",), None),
        ({**named, "tool_choice": "always"}, ("tool_choice",), None),
        # neighbours: a named choice without tools, one of another type, a name given as a number
        ({**omitted, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, either, None),
        ({**named, "tool_choice": {"type": "custom", "custom": {"name": "get_weather"}}}, ("tool_choice",), None),
        ({**named, "tool_choice": {"type": "function", "function": {"name": 5}}}, ("tool_choice",), None),
    ]


def _unsatisfiable_responses() -> list[tuple[dict[str, Any], tuple[str, ...], str | None]]:
    """The same for /v1/responses (flat function tools, flat named choice)."""
    base = {"model": "default", "input": "Hello", "max_output_tokens": 16}
    weather = {"type": "function", **GET_WEATHER["function"]}
    either = ("tool_choice", "tools")
    return [
        ({**base, "tool_choice": "required", "tools": []}, either, None),
        ({**base, "tool_choice": "required"}, either, None),
        ({**base, "tool_choice": "required", "tools": None}, either, None),
        ({**base, "tools": [weather], "tool_choice": {"type": "function", "name": "lookup"}}, ("tool_choice",),
         "lookup"),
        ({**base, "tools": [weather], "tool_choice": {"type": "function", "name": ""}}, ("tool_choice",), None),
        ({**base, "tools": [weather], "tool_choice": {"type": "function"}}, ("tool_choice",), None),
        ({**base, "tools": [weather], "tool_choice": "always"}, ("tool_choice",), None),
        ({**base, "tool_choice": {"type": "function", "name": "get_weather"}}, either, None),
    ]


def _problems(resp: httpx.Response, prefixes: tuple[str, ...], mention: str | None) -> list[str]:
    problems = error_problems(resp, 400, message_contains=mention)
    if not problems and not str(resp.json()["error"]["param"] or "").startswith(prefixes):
        problems.append(f"param {resp.json()['error']['param']!r} starts with none of {prefixes}")
    return problems


def test_case030_unsatisfiable_tool_choice_is_400_before_generation(server):
    """Every refused body, whole and with stream true, on chat and Responses: an HTTP 400 error
    object (JSON, not an SSE stream), param at tool_choice or tools, and no token reaches the
    engine (its counters do not move); a plain chat request after them is a 200."""
    checks = [(chat_url(server), body, p, m) for body, p, m in _unsatisfiable_chat()]
    checks += [(responses_url(server), body, p, m) for body, p, m in _unsatisfiable_responses()]
    checks += [(url, {**body, "stream": True}, p, m) for url, body, p, m in checks]
    wait_idle(server.url)
    before = counters(server.url)
    answers = parallel(*[lambda c=c: post(c[0], c[1]) for c in checks])
    failures = {f"{url.rsplit('/v1', 1)[1]} {body}": problems for (url, body, prefixes, mention), answer
                in zip(checks, answers, strict=True) if (problems := _problems(answer, prefixes, mention))}
    assert not failures, failures
    assert counters(server.url) == before, "a refused request reached the engine"
    plain = post(chat_url(server), {"model": "default", "messages": HELLO, "max_tokens": 4})
    assert plain.status_code == 200, plain.text


def test_case030_none_or_auto_without_tools_is_never_5xx(server):
    """tool_choice "none" or "auto" with tools omitted (chat and Responses, whole and streamed):
    200, or a 400 with the error object."""
    body = {k: v for k, v in case_body("030").items() if k != "tools"}
    rbody = {"model": "default", "input": "Hello", "max_output_tokens": 16}
    checks = [(url, {**b, "tool_choice": choice, "stream": stream})
              for url, b in ((chat_url(server), body), (responses_url(server), rbody))
              for choice in ("none", "auto") for stream in (False, True)]
    answers = parallel(*[lambda c=c: post(c[0], c[1]) for c in checks])
    for (url, b), answer in zip(checks, answers, strict=True):
        assert answer.status_code in (200, 400), (url, b, answer.status_code, answer.text[:300])
        if answer.status_code == 400:
            assert not error_problems(answer, 400), (url, b, error_problems(answer, 400))

"""Acceptance case 037 (../shared/cases): a validation error is bounded in size and does not echo
the request (no response amplification), on every route that takes a body or an id; end to end on
the real server.

Each route gets a body with thousands of failing items and bodies that carry one huge value where
the error message would quote it (an unknown field name, a model id, a union tag, a stored
response id, a logit_bias key); ids in the path are a few KiB (the HTTP server's line limit).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from tests.e2e.cases_support import HELLO, HTTP, case_body, error_problems, parallel, post

pytestmark = pytest.mark.slow

MAX_BODY_BYTES = 64 * 1024
MAX_MESSAGE_CHARS = 4096
HUGE = 100_000
PLAIN = {"model": "default", "messages": HELLO, "max_tokens": 4, "temperature": 0}


def _numbers_as_text(count: int) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]}] * count


def _bodies() -> list[tuple[str, dict[str, Any], int, str | None]]:
    """(path, body, expected status, param prefix) of every amplifying request."""
    case = case_body("037", input=_numbers_as_text(3000))
    chat = {"model": "default", "max_tokens": 16}
    key = "k" * HUGE
    return [
        ("/v1/responses", case, 400, "input"),
        ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": 5}] * 3000}, 400, "messages"),
        ("/v1/chat/completions", {**chat, "messages": HELLO, "max_tokens": "9" * 1_000_000}, 400, "max_tokens"),
        # neighbours: every body route, with many failing items and with one quoted huge value
        ("/v1/chat/completions", {**chat, "messages": HELLO, key: 1}, 400, None),
        ("/v1/chat/completions", {**chat, "messages": [{"role": "r" * 10_000, "content": "hi"}] * 300}, 400,
         "messages"),
        ("/v1/chat/completions", {**chat, "messages": HELLO, "response_format": {"type": "t" * HUGE}}, 400,
         "response_format"),
        ("/v1/chat/completions", {**chat, "messages": HELLO, "logit_bias": {"b" * HUGE: 1}}, 400, "logit_bias"),
        ("/v1/chat/completions", {**chat, "model": "m" * HUGE, "messages": HELLO}, 404, "model"),
        ("/v1/completions", {**chat, "prompt": [[{"x": 1}]] * 3000}, 400, "prompt"),
        ("/v1/completions", {**chat, "prompt": "hi", key: 1}, 400, None),
        ("/v1/completions", {**chat, "prompt": "hi", "max_tokens": "a" * 1_000_000}, 400, "max_tokens"),
        ("/v1/responses", {"model": "default", "input": "hi", key: 1}, 400, None),
        ("/v1/responses", {"model": "default", "input": "hi", "previous_response_id": "r" * HUGE}, 404,
         "previous_response_id"),
        ("/v1/responses", {"model": "default", "input": [{"type": "t" * HUGE}] * 30}, 400, "input"),
        ("/tokenize", {"model": "default", "messages": [{"role": "user", "content": 5}] * 3000}, 400, "messages"),
        ("/tokenize", {"model": "default", "prompt": "hi", key: 1}, 400, None),
        ("/detokenize", {"model": "default", "tokens": ["a" * 1000] * 3000}, 400, "tokens"),
        ("/v1/load_lora_adapter", {"lora_name": "n" * HUGE, "lora_path": "p" * HUGE}, None, None),
        ("/v1/unload_lora_adapter", {"lora_name": "n" * HUGE}, None, None),
    ]


def _bound_problems(resp: httpx.Response, request_bytes: int, status: int | None, param: str | None) -> list[str]:
    """Status (any 4xx when `status` is None), the error object, and the size bounds."""
    problems = []
    if status is None:
        if not 400 <= resp.status_code < 500:
            problems.append(f"status {resp.status_code}, expected a 4xx")
        status = resp.status_code
    problems += error_problems(resp, status, param)
    if len(resp.content) > min(MAX_BODY_BYTES, request_bytes):
        problems.append(f"body of {len(resp.content)} bytes for a request of {request_bytes}")
    try:
        message = resp.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return problems
    if len(message) > MAX_MESSAGE_CHARS:
        problems.append(f"error.message of {len(message)} characters")
    return problems


def test_case037_validation_errors_are_bounded(server):
    """Every amplifying body: its status with the error object (param at the field), a body of
    at most 64 KiB and at most the request's size, a message of at most 4096 characters; a plain
    request afterwards is a 200 within its normal latency."""
    def plain_seconds() -> float:
        start = time.monotonic()
        assert post(server.url + "/v1/chat/completions", PLAIN).status_code == 200
        return time.monotonic() - start

    before = min(plain_seconds() for _ in range(2))
    cases = _bodies()
    raw = [json.dumps(body) for _, body, _, _ in cases]
    answers = parallel(*[lambda p=p, r=r: post(server.url + p, r) for (p, _, _, _), r in zip(cases, raw)])
    failures = {f"{path} {raw_body[:80]}": problems for (path, _, status, param), raw_body, answer
                in zip(cases, raw, answers, strict=True)
                if (problems := _bound_problems(answer, len(raw_body.encode()), status, param))}
    assert not failures, failures
    after = plain_seconds()
    assert after < 3 * before + 1.0, f"a plain request took {after:.2f}s after the bad ones ({before:.2f}s before)"


def test_case037_neighbours_ids_in_paths_are_bounded(server):
    """Ids in the path (models, stored responses and their sub-resources, an unknown route) of a
    few KiB: a 4xx error object no larger than 64 KiB whose message is at most 4096 characters."""
    long_id = "x" * 6000
    requests = [("GET", f"/v1/models/{long_id}"), ("GET", f"/v1/responses/{long_id}"),
                ("DELETE", f"/v1/responses/{long_id}"), ("POST", f"/v1/responses/{long_id}/cancel"),
                ("GET", f"/v1/responses/{long_id}/input_items"), ("GET", f"/v1/{long_id}")]
    answers = parallel(*[lambda m=m, p=p: HTTP.request(m, server.url + p, timeout=60) for m, p in requests])
    failures = {f"{method} {path[:40]}": problems for (method, path), answer in zip(requests, answers, strict=True)
                if (problems := _bound_problems(answer, MAX_BODY_BYTES, None, None))}
    assert not failures, failures

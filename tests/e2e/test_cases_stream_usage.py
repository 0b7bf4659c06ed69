"""Acceptance case 007 (../shared/cases): `stream_options.include_usage` puts usage on one final
chunk only, on /v1/chat/completions and /v1/completions, end to end on the real server.

One test per case (`test_caseNNN_...`) checks every statement of the case's `expected` list that
applies to /v1/chat/completions and /v1/completions; `test_caseNNN_neighbours_...` tests the rest
of the case's kind; `test_caseNNN_responses_variant` checks the case's "Responses variant"
statements on /v1/responses.

The requests go to the server in the session fixture `batch` (tests/e2e/conftest.py) together with
those of the other case files; `batch_jobs` lists this file's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from openai.types.chat import ChatCompletionChunk as SdkChunk

from tests.e2e.cases_support import Jobs, case_body, chat_url, completions_url, post, post_sse

pytestmark = pytest.mark.slow


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    return _jobs_007(server)


# --- 007 -----------------------------------------------------------------------------------------------

def check_stream_contract(sse, obj: str, include_usage: bool, n: int = 1, max_tokens: int = 16):
    """The SSE contract: framing, one id/created/model, usage only on one final choices-less chunk
    (when asked), exactly one finish_reason per choice. Returns the usage chunk's usage (or None)."""
    assert sse.status == 200, sse.text[:300]
    assert sse.content_type.startswith("text/event-stream"), sse.content_type
    assert not sse.problems, sse.problems
    chunks = sse.chunks
    assert chunks and {c.get("object") for c in chunks} == {obj}, {c.get("object") for c in chunks}
    assert len({(c["id"], c["created"], c["model"]) for c in chunks}) == 1
    if obj == "chat.completion.chunk":   # (the SDK's Completion type has no null finish_reason for chunks)
        for chunk in chunks:
            SdkChunk.model_validate(chunk)
    with_usage = [i for i, c in enumerate(chunks) if c.get("usage") is not None]
    usage = None
    if include_usage:
        assert with_usage == [len(chunks) - 1], f"usage on chunks {with_usage} of {len(chunks)}"
        assert chunks[-1]["choices"] == []
        usage = chunks[-1]["usage"]
        assert usage["prompt_tokens"] > 0 and 1 <= usage["completion_tokens"] <= n * max_tokens, usage
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        chunks = chunks[:-1]
    else:
        assert with_usage == [], f"usage without include_usage on chunks {with_usage}"
    assert all(c["choices"] for c in chunks), "a chunk other than the usage chunk has empty choices"
    for i in range(n):
        finishes = [c for chunk in chunks for c in chunk["choices"] if c["index"] == i and c.get("finish_reason")]
        assert len(finishes) == 1, f"choice {i}: {len(finishes)} chunks with a finish_reason"
    return usage


def _jobs_007(server) -> dict[str, Callable[[], Any]]:
    body = case_body("007", temperature=0)
    plain = {k: v for k, v in body.items() if k != "stream_options"}
    cbody = {"model": "default", "prompt": "Say hello.", "max_tokens": 16, "temperature": 0}
    usage_on = {"stream": True, "stream_options": {"include_usage": True}}
    chat, cmpl = chat_url(server), completions_url(server)
    return {
        "007/usage": lambda: post_sse(chat, body),
        "007/whole": lambda: post(chat, {**plain, "stream": False}),
        "007/plain": lambda: post_sse(chat, plain),
        "007/false": lambda: post_sse(chat, {**body, "stream_options": {"include_usage": False}}),
        "007n/null": lambda: post_sse(chat, {**body, "stream_options": None}),
        "007n/n2": lambda: post_sse(chat, {**body, "n": 2}),
        "007n/cmpl_usage": lambda: post_sse(cmpl, {**cbody, **usage_on}),
        "007n/cmpl_whole": lambda: post(cmpl, cbody),
        "007n/cmpl_plain": lambda: post_sse(cmpl, {**cbody, "stream": True}),
        "007n/cmpl_n2": lambda: post_sse(cmpl, {**cbody, **usage_on, "n": 2}),
    }


def test_case007_usage_only_in_one_final_chunk(batch):
    usage = check_stream_contract(batch["007/usage"], "chat.completion.chunk", True)
    whole = batch["007/whole"]
    assert whole.status_code == 200, whole.text
    assert usage["completion_tokens"] == whole.json()["usage"]["completion_tokens"]
    for name in ("007/plain", "007/false"):
        check_stream_contract(batch[name], "chat.completion.chunk", False)


def test_case007_neighbours_completions_n2_and_null_options(batch):
    check_stream_contract(batch["007n/null"], "chat.completion.chunk", False)
    check_stream_contract(batch["007n/n2"], "chat.completion.chunk", True, n=2)
    usage = check_stream_contract(batch["007n/cmpl_usage"], "text_completion", True)
    whole = batch["007n/cmpl_whole"]
    assert whole.status_code == 200, whole.text
    assert usage["completion_tokens"] == whole.json()["usage"]["completion_tokens"]
    check_stream_contract(batch["007n/cmpl_plain"], "text_completion", False)
    check_stream_contract(batch["007n/cmpl_n2"], "text_completion", True, n=2)

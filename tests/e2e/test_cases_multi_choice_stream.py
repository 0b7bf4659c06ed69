"""Acceptance case 038 (../shared/cases): in a stream with n > 1 every choice gets its role once,
its finish_reason once and nothing after it, and the one usage chunk sums all choices; end to end
on the real server, chunks parsed by the official `openai` client.

Neighbours: /v1/completions with n=3 and with two prompts times n=2 (choice index = prompt *
n + choice), and chat choices that end in forced tool calls (finish_reason "tool_calls"). The
requests go to the server in the session fixture `batch` (tests/e2e/conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.cases_support import Jobs, case_body, chat_url, post

pytestmark = pytest.mark.slow

GET_TIME = {"type": "function", "function": {"name": "get_time", "description": "Return the current time",
                                             "parameters": {"type": "object", "properties": {}}}}


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    client = server.client()
    body = case_body("038")
    assert body["n"] == 3 and body["stream"] is True
    whole = {**body, "stream": False, "stream_options": None}
    usage = {"stream_options": {"include_usage": True}}
    cmpl = {"model": "default", "prompt": "Name three fruits:", "max_tokens": 8, "temperature": 0, "n": 3,
            "logprobs": 1, **usage}
    tools = {**body, "logprobs": False, "max_tokens": 40, "n": 2, "tools": [GET_TIME], "tool_choice": "required",
             "messages": [{"role": "user", "content": "What time is it?"}]}
    return {
        "038/stream": lambda: list(client.chat.completions.create(**body)),
        "038/n1": lambda: post(chat_url(server), {**whole, "n": 1}),
        "038/whole": lambda: post(chat_url(server), whole),
        "038/short": lambda: list(client.chat.completions.create(**{**body, "max_tokens": 2})),
        "038n/cmpl": lambda: list(client.completions.create(**cmpl, stream=True)),
        "038n/cmpl_batch": lambda: list(client.completions.create(
            **{**cmpl, "prompt": ["Name three fruits:", "Name two colours:"], "n": 2}, stream=True)),
        "038n/tools": lambda: list(client.chat.completions.create(**tools)),
    }


def choice_problems(chunks: list[Any], n: int, chat: bool = True) -> dict[int, list[str]]:
    """Per choice index 0..n-1: exactly one chunk with a finish_reason and no delta after it; for
    chat, role "assistant" on the first delta only. Returns the problems found (empty: none)."""
    problems: dict[int, list[str]] = {}
    entries: dict[int, list[Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            entries.setdefault(choice.index, []).append(choice)
    if sorted(entries) != list(range(n)):
        problems[-1] = [f"choice indices {sorted(entries)}, expected 0..{n - 1}"]
    for index, seen in entries.items():
        finished = [i for i, c in enumerate(seen) if c.finish_reason is not None]
        if len(finished) != 1 or finished[0] != len(seen) - 1:
            problems.setdefault(index, []).append(f"finish_reason at entries {finished} of {len(seen)}")
        if chat:
            roles = [i for i, c in enumerate(seen) if c.delta.role is not None]
            if roles != [0] or seen[0].delta.role != "assistant":
                problems.setdefault(index, []).append(f"role on entries {roles}")
    return problems


def usage_of(chunks: list[Any]) -> Any:
    """The usage of the stream: exactly one chunk carries it, the last one, with no choices."""
    carrying = [i for i, c in enumerate(chunks) if c.usage is not None]
    assert carrying == [len(chunks) - 1], f"usage on chunks {carrying} of {len(chunks)}"
    assert chunks[-1].choices == []
    return chunks[-1].usage


def contents(chunks: list[Any], n: int) -> list[str]:
    return ["".join(c.delta.content or "" for chunk in chunks for c in chunk.choices if c.index == i)
            for i in range(n)]


def test_case038_one_finish_and_role_per_choice_usage_summed(batch):
    stream = batch["038/stream"]
    assert not choice_problems(stream, 3), choice_problems(stream, 3)
    usage = usage_of(stream)
    num_logprobs = sum(len(c.logprobs.content or []) for chunk in stream for c in chunk.choices if c.logprobs)
    num_stops = sum(c.finish_reason == "stop" for chunk in stream for c in chunk.choices)
    # every token has a logprob entry but the end-of-turn token that ends a choice with "stop"
    assert usage.completion_tokens == num_logprobs + num_stops, (usage, num_logprobs, num_stops)
    single = batch["038/n1"]
    assert single.status_code == 200, single.text
    single = single.json()
    assert usage.prompt_tokens == single["usage"]["prompt_tokens"], (usage, single["usage"])
    texts = contents(stream, 3)
    assert texts == [single["choices"][0]["message"]["content"]] * 3, texts
    assert usage.completion_tokens == 3 * single["usage"]["completion_tokens"], (usage, single["usage"])
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    whole = batch["038/whole"]
    assert whole.status_code == 200, whole.text
    whole = whole.json()
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] for c in whole["choices"]), whole["choices"]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert {k: whole["usage"][k] for k in counts} == {k: getattr(usage, k) for k in counts}
    short = batch["038/short"]
    assert not choice_problems(short, 3), choice_problems(short, 3)
    finishes = [c.finish_reason for chunk in short for c in chunk.choices if c.finish_reason]
    assert finishes.count("length") == 3 and len(finishes) == 3, finishes


def test_case038_neighbours_completions_choices(batch):
    """Completions streams: n=3 and two prompts times n=2 (indices 0..3): one finish per choice,
    nothing after it, one usage chunk whose completion_tokens count every choice's tokens (each
    with a logprob entry but an ending EOS)."""
    for name, n in (("038n/cmpl", 3), ("038n/cmpl_batch", 4)):
        chunks = batch[name]
        assert not choice_problems(chunks, n, chat=False), (name, choice_problems(chunks, n, chat=False))
        usage = usage_of(chunks)
        num_tokens = sum(len(c.logprobs.tokens or []) for chunk in chunks for c in chunk.choices if c.logprobs)
        num_stops = sum(c.finish_reason == "stop" for chunk in chunks for c in chunk.choices)
        assert usage.completion_tokens == num_tokens + num_stops, (name, usage, num_tokens, num_stops)
    texts = ["".join(c.text for chunk in batch["038n/cmpl_batch"] for c in chunk.choices if c.index == i)
             for i in range(4)]
    assert texts[0] == texts[1] and texts[2] == texts[3], texts


def test_case038_neighbours_tool_call_choices(batch):
    """n=2 with a forced call: each choice ends once with finish_reason "tool_calls", role once,
    and its calls are addressed from index 0."""
    chunks = batch["038n/tools"]
    assert not choice_problems(chunks, 2), choice_problems(chunks, 2)
    usage_of(chunks)
    for i in range(2):
        finishes = [c.finish_reason for chunk in chunks for c in chunk.choices if c.index == i and c.finish_reason]
        assert finishes == ["tool_calls"], (i, finishes)
        deltas = [d for chunk in chunks for c in chunk.choices if c.index == i for d in c.delta.tool_calls or []]
        assert deltas and deltas[0].index == 0 and deltas[0].function.name == "get_time", deltas[:1]

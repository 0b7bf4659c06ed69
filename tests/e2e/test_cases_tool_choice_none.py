"""Acceptance case 028 (../shared/cases): tool_choice "none" suppresses tool calls on every path
(grammar, parser, stream) of /v1/chat/completions and /v1/responses, end to end on the real server.

The case's statements are checked on the case's body as it is; the neighbours force the output
to be call-shaped text (a `structured_outputs` regex for the Hermes `<tool_call>` block) so that
a parser that still ran under "none" would turn it into a call: it must come back as content,
whole and streamed. Stream statements read chunks through the official `openai` client.

The requests go to the server in the session fixture `batch` (tests/e2e/conftest.py) together with
those of the other case files; `batch_jobs` lists this file's.
"""

from __future__ import annotations

from typing import Any

import pytest

from api.config import ServerConfig
from tests.e2e.cases_support import Jobs, case_body, chat_url, post, responses_url, sdk_stream
from toolparsers import ToolSpec, get_tool_parser

pytestmark = pytest.mark.slow

# the whole Hermes call block for get_time: call-shaped text a tool parser would take as a call
CALL_TEXT = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
CALL_REGEX = r'<tool_call>\n\{"name": "get_time", "arguments": \{\}\}\n</tool_call>'


def _responses_body(**overrides: Any) -> dict[str, Any]:
    """The case's chat body in Responses shapes (flat function tools, input text)."""
    body = case_body("028")
    return {"model": body["model"], "input": body["messages"][0]["content"], "temperature": 0,
            "max_output_tokens": body["max_tokens"], "tool_choice": "none",
            "tools": [{"type": "function", **tool["function"]} for tool in body["tools"]], **overrides}


def _sdk_events(client, body: dict[str, Any]) -> list[Any]:
    """Every event of a streamed Responses request, as the openai client parses them."""
    return list(client.responses.create(**body, stream=True))


# started first in the shared batch (two sampled choices of 64 tokens): cases_support.collected_batch_jobs
LONG_JOBS = ("028/n2",)


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    chat, resp = chat_url(server), responses_url(server)
    client = server.client()
    body = case_body("028")
    regex = {"structured_outputs": {"regex": CALL_REGEX}}     # (a vLLM extension: extra_body in the SDK)
    forced = {**body, **regex}
    history = {**body, "messages": [
        body["messages"][0],
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
        {"role": "user", "content": "Call get_time again."}]}
    return {
        "028/whole": lambda: post(chat, body),
        "028/stream": lambda: sdk_stream(client, **body),
        "028/n2": lambda: post(chat, {**body, "n": 2, "temperature": 1.0}),
        "028/responses": lambda: post(resp, _responses_body()),
        "028/named": lambda: post(chat, {**body, "tool_choice": {"type": "function",
                                                                 "function": {"name": "get_time"}}}),
        "028n/forced_whole": lambda: post(chat, forced),
        "028n/forced_stream": lambda: sdk_stream(client, **body, extra_body=regex),
        "028n/forced_n2": lambda: sdk_stream(client, **{**body, "n": 2, "temperature": 1.0}, extra_body=regex),
        "028n/history": lambda: post(chat, history),
        "028n/responses_stream": lambda: _sdk_events(client, _responses_body()),
    }


def check_no_calls(choice: dict[str, Any], completion_tokens: int) -> None:
    """A whole chat choice of a tool_choice "none" request: no calls, finish stop/length, the text kept."""
    assert not choice["message"].get("tool_calls"), choice
    assert choice["finish_reason"] in ("stop", "length"), choice
    if completion_tokens > 0:
        assert isinstance(choice["message"]["content"], str) and choice["message"]["content"], choice


def test_case028_tool_choice_none_never_calls(batch):
    whole = batch["028/whole"]
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    check_no_calls(answer["choices"][0], answer["usage"]["completion_tokens"])
    stream = batch["028/stream"]
    assert stream["calls"] == {0: []}, stream["calls"]
    assert stream["content"][0] == answer["choices"][0]["message"]["content"]
    assert stream["finish"][0][-1] == answer["choices"][0]["finish_reason"], stream["finish"]
    n2 = batch["028/n2"]
    assert n2.status_code == 200, n2.text
    assert [c["index"] for c in n2.json()["choices"]] == [0, 1]
    for choice in n2.json()["choices"]:
        assert not choice["message"].get("tool_calls") and choice["finish_reason"] != "tool_calls", choice
    resp = batch["028/responses"]
    assert resp.status_code == 200, resp.text
    assert [item["type"] for item in resp.json()["output"] if item["type"] == "function_call"] == [], resp.json()
    named = batch["028/named"]
    assert named.status_code == 200, named.text
    calls = named.json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_time"], calls


def test_case028_neighbours_call_shaped_text_stays_content(batch):
    """Output forced to be a whole Hermes call block under "none" comes back as that text, whole,
    streamed and for every choice of n=2; the served tool parser reads that block as a call (so a
    parser left running under "none" would have taken it)."""
    whole = batch["028n/forced_whole"]
    assert whole.status_code == 200, whole.text
    choice = whole.json()["choices"][0]
    check_no_calls(choice, whole.json()["usage"]["completion_tokens"])
    assert choice["message"]["content"] == CALL_TEXT, choice
    stream = batch["028n/forced_stream"]
    assert stream["calls"] == {0: []} and stream["content"] == {0: CALL_TEXT}, stream
    assert stream["finish"] == {0: ["stop"]}, stream["finish"]
    n2 = batch["028n/forced_n2"]
    assert n2["calls"] == {0: [], 1: []} and n2["content"] == {0: CALL_TEXT, 1: CALL_TEXT}, n2
    assert n2["finish"] == {0: ["stop"], 1: ["stop"]}, n2["finish"]
    parser = get_tool_parser(ServerConfig().tool_call_parser)([ToolSpec(name="get_time")])
    assert [c.name for c in parser.parse(CALL_TEXT).tool_calls] == ["get_time"], "CALL_TEXT is no call"


def test_case028_neighbours_history_and_responses_stream(batch):
    """A conversation that already holds a call and its result, under "none": still no call. The
    Responses stream under "none": no function_call item or argument event, and its text equals
    the unstreamed response's."""
    history = batch["028n/history"]
    assert history.status_code == 200, history.text
    check_no_calls(history.json()["choices"][0], history.json()["usage"]["completion_tokens"])
    events = batch["028n/responses_stream"]
    types = [e.type for e in events]
    assert types[-1] in ("response.completed", "response.incomplete"), types
    assert not [t for t in types if t.startswith("response.function_call")], types
    added = [e.item.type for e in events if e.type in ("response.output_item.added", "response.output_item.done")]
    assert "function_call" not in added, added
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    whole = batch["028/responses"].json()
    texts = [part["text"] for item in whole["output"] if item["type"] == "message" for part in item["content"]]
    assert streamed == "".join(texts), (streamed, texts)

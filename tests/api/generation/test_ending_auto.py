"""The endings matrix of tool_choice "auto" in parse-only mode (`--no-constrain-auto-tools`: no
grammar, so stops and max_tokens can cut a call anywhere): the FakeEngine plays a call in each
parser's format after some text, cut by each ending, through chat (n=2), Responses and Messages,
whole and streamed (the official clients assemble the streams); stop_token_ids on chat only (an
extra of chat and completions). A timeout or an abort inside a call, with "auto" and with a
forced tool_choice, on all three endpoints.

Rules (`api/generation/ending.py`): text the model wrote is never silently dropped, and a call
whose header already streamed stays a call; so a call cut by a stop string or max_tokens after its
header is that call, its arguments the model's text verbatim (not JSON), and finish_reason is the
engine's ("stop", "length"), never "tool_calls"; whole calls with no call left open are
"tool_calls" (also when max_tokens then cut the text after them); Anthropic's stop_reason and the
Responses status agree. Stream and whole answers are equal in every row.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, messages_whole_and_streamed, sdk_client, sse_events
from fastapi import FastAPI

from api.app import create_app
from api.config import ServerConfig
from api.errors import RequestAborted
from engine.errors import RequestTimedOut
from engine.request import EngineRequest
from toolparsers import get_tool_parser

pytestmark = pytest.mark.anyio

CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Dublin"}}\n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Dublin"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Dublin"}}]',
    "pythonic": '[get_weather(city="Dublin")]',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nDublin\n</parameter>\n</function>\n"
                   "</tool_call>",
}
WEATHER = {"name": "get_weather", "description": "Weather of a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
BEFORE = "Let me check.\n"
AFTER = "\nIt is sunny today."
ANTHROPIC_STOP = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


def _script(parser: str, ending: str) -> tuple[str, dict[str, Any]]:
    """(the text the model writes, request fields) of one ending."""
    call = CALLS[parser]
    if ending == "EOS after the call":
        return BEFORE + call, {"max_tokens": 400}
    if ending == "stop string inside the call":
        return BEFORE + call, {"max_tokens": 400, "stop": ["Dublin"]}
    if ending == "stop_token_ids inside the call":   # the FakeEngine's byte tokens: "D" of "Dublin"
        return BEFORE + call, {"max_tokens": 400, "extra_body": {"stop_token_ids": [ord("D")]}}
    if ending == "max_tokens inside the call":
        return BEFORE + call, {"max_tokens": len(BEFORE) + call.index("Dublin") + 2}
    return BEFORE + call + AFTER, {"max_tokens": len(BEFORE + call) + 6}   # max_tokens after the call


def _arguments(text: str) -> Any:
    """A call's arguments: the parsed object, or the text itself when it is not JSON (a call cut
    after its header streamed keeps the model's text verbatim)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _expected(parser: str, ending: str) -> tuple[str, list[tuple[str, Any]], str]:
    """(content, [(name, arguments object, or the verbatim text of a cut call)], finish_reason)
    the rules give."""
    text, fields = _script(parser, ending)
    if ending.startswith("stop"):
        cut, reason = text[: text.index("Dublin")], "stop"
    else:
        cut, reason = text[: fields["max_tokens"]], "length"
    parsed = get_tool_parser(parser)().parse(cut)
    calls = [(c.name, _arguments(c.arguments)) for c in parsed.tool_calls]
    if ending.endswith("inside the call"):   # the header streamed: a call, its arguments cut verbatim
        [call] = parsed.tool_calls
        assert parsed.cut_call_ids == {call.id} and parsed.content == BEFORE.rstrip("\n")
        with pytest.raises(json.JSONDecodeError):
            json.loads(call.arguments)
        return parsed.content, calls, reason
    return parsed.content, calls, "tool_calls"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=8192)


@pytest.fixture(params=list(CALLS))
def parser(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def app(engine: FakeEngine, parser: str) -> AsyncIterator[FastAPI]:
    app = create_app(engine, ServerConfig(sse_ping_interval_s=0, tool_call_parser=parser, constrain_auto_tools=False))
    yield app
    app.state.responses.store.close()


def _play(engine: FakeEngine, text: str) -> None:
    def script(request: EngineRequest, index: int) -> str:
        return text

    engine.script_for = script


async def _chat(app: FastAPI, fields: dict[str, Any]) -> tuple[str, list[tuple[str, Any]], str]:
    body = dict(model="fake-model", messages=[{"role": "user", "content": "Weather?"}], n=2, temperature=0,
                tools=[{"type": "function", "function": WEATHER}], **fields)
    async with sdk_client(app) as client:
        whole = await client.chat.completions.create(**body)
        chunks = [c async for c in await client.chat.completions.create(**body, stream=True)]
    results = []
    for choice in whole.choices:
        calls = [(c.function.name, _arguments(c.function.arguments)) for c in choice.message.tool_calls or []]
        results.append((choice.message.content or "", calls, choice.finish_reason))
    for index, result in enumerate(results):
        content, calls, reasons = "", {}, []
        for chunk in chunks:
            for choice in (c for c in chunk.choices if c.index == index):
                content += choice.delta.content or ""
                for delta in choice.delta.tool_calls or []:
                    calls.setdefault(delta.index, [delta.function.name, ""])[1] += delta.function.arguments or ""
                reasons += [choice.finish_reason] if choice.finish_reason else []
        streamed = [(n, _arguments(a)) for n, a in calls.values()]
        assert (content, streamed, reasons) == (*result[:2], [result[2]])
    assert results[0] == results[1]
    return results[0]


async def _responses(app: FastAPI, fields: dict[str, Any]) -> tuple[str, list[tuple[str, Any]], str]:
    body: dict[str, Any] = dict(model="fake-model", input="Weather?", temperature=0,
                                tools=[{"type": "function", **WEATHER}], max_output_tokens=fields["max_tokens"])
    async with sdk_client(app) as client:
        whole = await client.responses.create(**body)
        events = [e async for e in await client.responses.create(**body, stream=True)]
    got = []
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    for response in (whole, events[-1].response):
        items = [i for i in response.output if i.type == "function_call"]
        calls = [(i.name, _arguments(i.arguments)) for i in items]
        assert [i.status for i in items] == [i.status for i in done]
        # a call the output ended inside is an "incomplete" item (its arguments are not JSON)
        assert [i.status for i in items] == ["completed" if isinstance(a, dict) else "incomplete" for _, a in calls]
        got.append((response.output_text, calls, response.status))
    assert got[0] == got[1]
    return got[0]


async def _messages(app: FastAPI, fields: dict[str, Any]) -> tuple[str, list[tuple[str, Any]], str, str | None]:
    body: dict[str, Any] = dict(model="fake-model", messages=[{"role": "user", "content": "Weather?"}],
                                max_tokens=fields["max_tokens"], tools=[{"name": WEATHER["name"],
                                "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}])
    if "stop" in fields:
        body["stop_sequences"] = fields["stop"]
    return await messages_whole_and_streamed(app, body)


@pytest.mark.parametrize("ending", ["EOS after the call", "stop string inside the call",
                                    "stop_token_ids inside the call", "max_tokens inside the call",
                                    "max_tokens after the call"])
async def test_ending_in_auto_parse_only(app: FastAPI, engine: FakeEngine, parser: str, ending: str) -> None:
    text, fields = _script(parser, ending)
    _play(engine, text)
    expected = _expected(parser, ending)
    assert await _chat(app, fields) == expected
    content, calls, finish_reason = expected
    if "extra_body" in fields:   # stop_token_ids: a chat / completions extra only
        return
    if "stop" not in fields:   # Responses has no stop sequences
        output_text, response_calls, status = await _responses(app, fields)
        assert (response_calls, status) == (calls, "incomplete" if finish_reason == "length" else "completed")
        assert output_text.replace("\n", "") == content.replace("\n", "")
    text_out, uses, stop_reason, stop_sequence = await _messages(app, fields)
    if ending.endswith("inside the call"):
        # a tool_use input is an object: what the streamed prefix parses to ({}: the city string
        # was still open), the rest of the call's text a text block after it. The JSON formats
        # streamed all of their text; pythonic and qwen3_coder only "{" (they stream the JSON they
        # build, one parameter at a time, and no parameter was complete)
        [(name, arguments)] = calls
        rest = arguments[1:] if parser in ("pythonic", "qwen3_coder") else ""
        calls, content = [(name, {})], content + rest
    assert (text_out.replace("\n", ""), uses) == (content.replace("\n", ""), calls)
    if "stop" in fields:
        assert (stop_reason, stop_sequence) == ("stop_sequence", "Dublin")
    else:
        assert stop_reason == ANTHROPIC_STOP[finish_reason]


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
@pytest.mark.parametrize("failure", [RequestTimedOut("the request did not finish within 2 s (--request-timeout)"),
                                     RequestAborted("the server aborted the request")])
async def test_timeout_or_abort_inside_a_call_fails_without_markup(
    app: FastAPI, engine: FakeEngine, parser: str, failure: Exception, tool_choice: str
) -> None:
    """A timeout or an abort (shutdown) while a call is open is no ending: whole, the request fails
    (408 / 503, the API's error body); streamed, the content that went out is the text ahead of
    the call, never its markup, and the call's header and the fragments of its arguments already
    generated went out as call deltas (arguments stream as generated: a delta cannot wait for an
    ending that may never come); they are a strict prefix of the call's arguments, never a whole
    call, then one error event (chat, no finish_reason) / the item closed "incomplete", error +
    response.failed (Responses) / an Anthropic error event. The same with a forced tool_choice
    ("required" / "any"), whose call starts the output (no text ahead of it)."""
    before = BEFORE if tool_choice == "auto" else ""
    _play(engine, before + CALLS[parser])
    engine.fail_after_tokens = len(before) + CALLS[parser].index("Dublin")
    engine.failure = failure
    status = 408 if isinstance(failure, RequestTimedOut) else 503
    [whole_call] = get_tool_parser(parser)().parse(CALLS[parser]).tool_calls

    def partial(arguments: str) -> bool:   # a strict prefix of the whole call's arguments
        return whole_call.arguments.startswith(arguments) and arguments != whole_call.arguments

    tools = [{"type": "function", "function": WEATHER}]
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "Weather?"}], "tools": tools,
            "tool_choice": tool_choice}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == status
        streamed = await client.post("/v1/chat/completions", json={**chat, "stream": True})
        events = [json.loads(p) for p in sse_events(streamed.text)]
        content = "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])
        assert content == before.rstrip("\n") and "error" in events[-1]
        assert not any(c["finish_reason"] for e in events[:-1] for c in e["choices"])
        calls: dict[int, list[str]] = {}
        choices = [c for e in events[:-1] for c in e["choices"]]
        for delta in (d for c in choices for d in c["delta"].get("tool_calls") or []):
            entry = calls.setdefault(delta["index"], [delta["function"].get("name"), ""])
            entry[1] += delta["function"].get("arguments") or ""
        assert list(calls) == [0]   # the header went out: the name was known, the arguments begun
        assert all(name == "get_weather" and partial(arguments) for name, arguments in calls.values())
        body = {"model": "fake-model", "input": "Weather?", "tools": [{"type": "function", **WEATHER}],
                "tool_choice": tool_choice}
        assert (await client.post("/v1/responses", json=body)).status_code == status
        lines = (await client.post("/v1/responses", json={**body, "stream": True})).text.splitlines()
        events = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
        assert [e["type"] for e in events[-2:]] == ["error", "response.failed"]
        texts = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        assert "".join(texts) == before.rstrip("\n")
        items = [e["item"] for e in events if e["type"] == "response.output_item.done"
                 and e["item"]["type"] == "function_call"]
        assert [(i["status"], partial(i["arguments"])) for i in items] == [("incomplete", True)]
        messages = {"model": "fake-model", "max_tokens": 400, "messages": [{"role": "user", "content": "Weather?"}],
                    "tools": [{"name": "get_weather", "input_schema": WEATHER["parameters"]}],
                    "tool_choice": {"type": tool_choice.replace("required", "any")}}
        assert (await client.post("/v1/messages", json=messages)).status_code == status
        text = (await client.post("/v1/messages", json={**messages, "stream": True})).text
        assert "event: error" in text
        events = [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
        deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
        assert "".join(d.get("text", "") for d in deltas) == before.rstrip("\n")
        assert partial("".join(d.get("partial_json", "") for d in deltas))
        uses = [e["content_block"] for e in events if e["type"] == "content_block_start"
                and e["content_block"]["type"] == "tool_use"]
        assert [u["name"] for u in uses] == ["get_weather"]

"""Tool-call answers, whole and streamed, read by the official `openai` client (cases 001, 003, 004,
005, 007): ids and indices, text around calls, no marker text in content, finish_reason, usage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from api_support import FakeEngine, chat_body, sse_json, sdk_client
from fastapi import FastAPI

from engine.request import EngineRequest

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Do it."}]
WRITE_FILE = {
    "type": "function",
    "function": {
        "name": "write_file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
            "required": ["path", "text"],
            "additionalProperties": False,
        },
    },
}
GET_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
GET_TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
TOOLS = [WRITE_FILE, GET_WEATHER, GET_TIME]


def call_text(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n</tool_call>'


PARALLEL = (
    call_text("write_file", {"path": "a.txt", "text": "alpha"})
    + "\n"
    + call_text("write_file", {"path": "b.txt", "text": "beta"})
)
TEXT_AROUND = "Let me check.\n" + call_text("get_weather", {"city": "Dublin"}) + "\nDone."
UNICODE = call_text("get_weather", {"city": 'Zürich ☃ "quoted" \\ back'})
MALFORMED = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=8192)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sdk_client(app) as client:
        yield client


def play(engine: FakeEngine, *texts: str) -> None:
    """Choice i of every request answers texts[i]."""

    def script(request: EngineRequest, index: int) -> str:
        return texts[index]

    engine.script_for = script


async def whole(client: openai.AsyncOpenAI, **fields: Any) -> Any:
    return await client.chat.completions.create(model="default", messages=MESSAGES, tools=TOOLS, **fields)


async def chunks(client: openai.AsyncOpenAI, **fields: Any) -> list[Any]:
    stream = await client.chat.completions.create(
        model="default", messages=MESSAGES, tools=TOOLS, stream=True, **fields
    )
    return [chunk async for chunk in stream]


def reassemble(chunk_list: list[Any], index: int = 0) -> tuple[str, list[dict[str, Any]], list[str]]:
    """(content, calls by index, finish reasons) of choice `index`, checking the delta rules of case 001."""
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    reasons = []
    for chunk in chunk_list:
        for choice in chunk.choices:
            if choice.index != index:
                continue
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                assert isinstance(delta.index, int) and delta.index >= 0
                if delta.id is not None:  # opens a call: a new index, in order
                    assert delta.index == len(calls) and delta.id.startswith("call_")
                    assert delta.type == "function" and delta.function.name and delta.function.arguments == ""
                    calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
                else:  # later deltas only add arguments
                    assert delta.index in calls and delta.type is None and delta.function.name is None
                    calls[delta.index]["arguments"] += delta.function.arguments
            if choice.finish_reason is not None:
                reasons.append(choice.finish_reason)
    assert len({c["id"] for c in calls.values()}) == len(calls)
    return content, [calls[i] for i in sorted(calls)], reasons


def as_calls(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


async def test_parallel_calls_whole_and_streamed(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    play(engine, PARALLEL)
    result = await whole(client, tool_choice="required", temperature=0)
    message, choice = result.choices[0].message, result.choices[0]
    assert message.content is None and choice.finish_reason == "tool_calls"
    assert as_calls(message) == [
        ("write_file", {"path": "a.txt", "text": "alpha"}),
        ("write_file", {"path": "b.txt", "text": "beta"}),
    ]
    assert all(c.id.startswith("call_") and c.type == "function" for c in message.tool_calls)
    assert len({c.id for c in message.tool_calls}) == 2
    content, calls, reasons = reassemble(await chunks(client, tool_choice="required", temperature=0))
    assert content == "" and reasons == ["tool_calls"]
    assert [c["name"] for c in calls] == ["write_file", "write_file"]
    assert [json.loads(c["arguments"]) for c in calls] == [args for _, args in as_calls(message)]


async def test_text_around_a_call(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    play(engine, TEXT_AROUND)
    result = await whole(client)
    assert result.choices[0].message.content == "Let me check.\nDone."
    assert as_calls(result.choices[0].message) == [("get_weather", {"city": "Dublin"})]
    assert result.choices[0].finish_reason == "tool_calls"
    stream = await chunks(client)
    content, calls, reasons = reassemble(stream)
    assert content == "Let me check.\nDone." and reasons == ["tool_calls"]
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Dublin"})]
    for chunk in stream:  # the byte-per-step fake shows any marker prefix that would leak
        for choice in chunk.choices:
            assert "<" not in (choice.delta.content or "") and "tool_call" not in (choice.delta.content or "")


async def test_unicode_and_escapes_in_arguments(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    play(engine, UNICODE)
    expected = [("get_weather", {"city": 'Zürich ☃ "quoted" \\ back'})]
    assert as_calls((await whole(client)).choices[0].message) == expected
    _, calls, _ = reassemble(await chunks(client))
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == expected


async def test_malformed_call_stays_content(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    malformed = '<tool_call>\n{"arguments": {"city": }, "name": "get_weather"}\n</tool_call>'  # no header
    play(engine, malformed)
    result = await whole(client)
    assert result.choices[0].message.content == malformed and result.choices[0].message.tool_calls is None
    assert result.choices[0].finish_reason == "stop"
    content, calls, reasons = reassemble(await chunks(client))
    assert content == malformed and calls == [] and reasons == ["stop"]


async def test_malformed_arguments_after_the_header_are_the_models_text(
    client: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    """The header streamed, so the call stays a call: its arguments are what the model wrote (not
    JSON, so a client's parse fails loudly), whole and streamed alike (toolparsers/base.py)."""
    play(engine, MALFORMED)
    result = await whole(client)
    [call] = result.choices[0].message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": }')
    assert result.choices[0].message.content is None
    content, calls, reasons = reassemble(await chunks(client))
    assert content == "" and [(c["name"], c["arguments"]) for c in calls] == [("get_weather", '{"city": }')]
    assert reasons == ["tool_calls"] == [result.choices[0].finish_reason]


async def test_cut_inside_a_call_is_length(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    # auto: the text the model wrote before the cut is content (never silently dropped)
    text = "Sure.\n" + call_text("get_weather", {"city": "Dublin"})
    play(engine, text)
    result = await whole(client, max_tokens=30)
    assert result.choices[0].finish_reason == "length"
    assert result.choices[0].message.content == text[:30] and result.choices[0].message.tool_calls is None
    content, calls, reasons = reassemble(await chunks(client, max_tokens=30))
    assert content == text[:30] and calls == [] and reasons == ["length"]


async def test_cut_inside_a_forced_call_drops_it(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    # required: the cut-off call is dropped, its marker text never reaches content
    play(engine, call_text("get_weather", {"city": "Dublin"}))
    result = await whole(client, max_tokens=30, tool_choice="required")
    assert result.choices[0].finish_reason == "length"
    assert not result.choices[0].message.content and result.choices[0].message.tool_calls is None
    content, calls, reasons = reassemble(await chunks(client, max_tokens=30, tool_choice="required"))
    assert content == "" and calls == [] and reasons == ["length"]


async def test_cut_inside_a_second_call_keeps_the_first(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    # required: the cut second call is dropped; the first is whole, so the answer is "tool_calls"
    first = call_text("get_weather", {"city": "Dublin"})
    text = first + "\n" + call_text("get_weather", {"city": "Cork"})
    play(engine, text)
    limit = len(first) + 20
    result = await whole(client, max_tokens=limit, tool_choice="required")
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert [json.loads(c.function.arguments) for c in choice.message.tool_calls] == [{"city": "Dublin"}]
    content, calls, reasons = reassemble(await chunks(client, max_tokens=limit, tool_choice="required"))
    assert content == "" and [json.loads(c["arguments"]) for c in calls] == [{"city": "Dublin"}]
    assert reasons == ["tool_calls"]


async def test_named_choice_stream(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    # case 003: the name once per index, with id and type; no content; same finish as stream=false
    play(engine, call_text("get_weather", {"city": "Oslo"}))
    named = {"type": "function", "function": {"name": "get_weather"}}
    stream = await chunks(client, tool_choice=named)
    names = [
        d.function.name
        for c in stream
        for ch in c.choices
        for d in ch.delta.tool_calls or []
        if d.function.name
    ]
    assert names == ["get_weather"]
    content, calls, reasons = reassemble(stream)
    assert content == "" and json.loads(calls[0]["arguments"]) == {"city": "Oslo"}
    assert reasons == [(await whole(client, tool_choice=named)).choices[0].finish_reason] == ["tool_calls"]


async def test_required_stream_with_usage(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    # cases 004 and 007: a tool without parameters gets "{}"; one usage-only chunk, last
    play(engine, call_text("get_time", {}))
    stream = await chunks(client, tool_choice="required", stream_options={"include_usage": True})
    content, calls, reasons = reassemble(stream)
    assert content == "" and reasons == ["tool_calls"]
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_time", "{}")]
    assert [c.usage is not None for c in stream] == [False] * (len(stream) - 1) + [True]
    assert stream[-1].choices == [] and stream[-1].usage.completion_tokens == len(call_text("get_time", {}))
    assert all(c.choices for c in stream[:-1])
    last_choice_chunk = stream[-2]
    assert last_choice_chunk.choices[0].finish_reason == "tool_calls"
    without = await chunks(client, tool_choice="required")
    assert all(c.usage is None and c.choices for c in without)


async def test_n_choices_parse_separately(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    play(engine, call_text("get_time", {}), "No call here.")
    result = await whole(client, n=2)
    assert as_calls(result.choices[0].message) == [("get_time", {})]
    assert result.choices[0].finish_reason == "tool_calls"
    assert (
        result.choices[1].message.content == "No call here." and result.choices[1].message.tool_calls is None
    )
    assert result.choices[1].finish_reason == "stop"
    stream = await chunks(client, n=2)
    assert reassemble(stream, 0)[2] == ["tool_calls"] and len(reassemble(stream, 0)[1]) == 1
    assert reassemble(stream, 1) == ("No call here.", [], ["stop"])


async def test_sdk_stream_helper_accumulates_calls(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    play(engine, TEXT_AROUND)
    async with client.chat.completions.stream(model="default", messages=MESSAGES, tools=TOOLS) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Let me check.\nDone." and final.choices[0].finish_reason == "tool_calls"
    assert as_calls(message) == [("get_weather", {"city": "Dublin"})]


async def test_logprobs_with_tool_calls(engine: FakeEngine, app: FastAPI) -> None:
    """With a call, content logprobs list the content's tokens only (api/protocol/logprobs_content.py),
    streamed and whole; the call's markup and arguments have none."""
    play(engine, "Hi " + call_text("get_time", {}))
    body = chat_body(tools=TOOLS, logprobs=True, max_tokens=100)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
        streamed = await http.post("/v1/chat/completions", json={**body, "stream": True})
        whole = (await http.post("/v1/chat/completions", json=body)).json()["choices"][0]
    events = sse_json(streamed.text)
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    tokens = [t["token"] for e in events if e["choices"] and e["choices"][0]["logprobs"]
              for t in e["choices"][0]["logprobs"]["content"]]
    assert content.strip() == "Hi" and "".join(tokens) == content, (content, tokens)
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert [t["token"] for t in whole["logprobs"]["content"]] == tokens
    assert whole["message"]["content"] == content and whole["finish_reason"] == "tool_calls"




async def test_arguments_stream_as_fragments_in_openais_shape(client: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    """Issue 14: the header (index, id, type, name, arguments "") first, then fragments as generated."""
    text = "Some poem line, again and again. " * 6
    play(engine, "Writing.\n" + call_text("write_file", {"path": "p.txt", "text": text}))
    chunk_list = await chunks(client)
    content, calls, reasons = reassemble(chunk_list)
    fragments = [d.function.arguments for c in chunk_list for d in (c.choices[0].delta.tool_calls or [])
                 if c.choices and d.id is None]
    assert len(fragments) > 10 and all(fragments)
    assert content == "Writing." and reasons == ["tool_calls"]
    assert json.loads(calls[0]["arguments"]) == {"path": "p.txt", "text": text}
    whole_call = (await whole(client)).choices[0].message.tool_calls[0]
    assert (whole_call.function.name, whole_call.function.arguments) == (calls[0]["name"], calls[0]["arguments"])

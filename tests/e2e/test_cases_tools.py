"""Acceptance cases 001, 003, 004 and 005 (../shared/cases): streamed and whole tool calls, end
to end on the real server.

One test per case (`test_caseNNN_...`) checks every statement of the case's `expected` list that
applies to /v1/chat/completions and /v1/completions; `test_caseNNN_neighbours_...` tests the rest
of the case's kind; `test_caseNNN_responses_variant` checks the case's "Responses variant"
statements on /v1/responses.

The generation-heavy requests go to the server in the session fixture `batch` (tests/e2e/conftest.py)
together with those of the other case files; `batch_jobs` lists this file's, the tests only read
the results. Raw SSE is read with httpx where the framing matters; client-visible shapes go
through the official `openai` client (or its chunk types).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletion as SdkChatCompletion
from openai.types.chat import ChatCompletionChunk as SdkChunk

from api.config import ServerConfig
from tests.e2e.cases_support import (
    Jobs,
    case_body,
    chat_url,
    log_problems,
    message_calls,
    no_content,
    parsed_arguments,
    post,
    post_sse,
    reassemble_tool_calls,
    sdk_stream,
    validator,
)
from toolparsers import ParseResult, ToolSpec, get_tool_parser

pytestmark = pytest.mark.slow


# started first in the shared batch (calls of up to 200 tokens, or two choices): cases_support.collected_batch_jobs
LONG_JOBS = ("004/whole", "004n/logprobs", "004n/whole_n2", "001n/n2", "001/whole", "001/stream")


def batch_jobs(server) -> Jobs:
    """This file's requests for the shared `batch`."""
    return {**_jobs_001(server), **_jobs_004(server), **_jobs_005(server), **_jobs_003(server)}


def test_batch_logged_no_failure(batch):
    """No traceback, ERROR line or failed stream in the server log while the shared batch (the
    requests of every selected case file) ran (case 004: "the server logs no exception for the
    request")."""
    slowest = sorted(batch.seconds.items(), key=lambda item: -item[1])[:8]
    print("slowest batch requests:", ", ".join(f"{name} {sec:.0f}s" for name, sec in slowest))
    assert not log_problems(batch.log), log_problems(batch.log)


# --- 001 -----------------------------------------------------------------------------------------------

def _jobs_001(server) -> dict[str, Callable[[], Any]]:
    body = case_body("001")
    sampled = case_body("001", temperature=0.8, seed=5)
    return {
        "001/stream": lambda: post_sse(chat_url(server), body),
        "001/whole": lambda: post(chat_url(server), {**body, "stream": False}),
        "001n/n2": lambda: post_sse(chat_url(server), {**sampled, "n": 2}),
        "001n/single": lambda: post_sse(chat_url(server), {**sampled, "parallel_tool_calls": False}),
    }


def test_case001_streamed_parallel_tool_calls_each_get_own_index(batch):
    body = case_body("001")
    schema = body["tools"][0]["function"]["parameters"]
    stream, whole = batch["001/stream"], batch["001/whole"]
    assert stream.status == 200 and stream.content_type.startswith("text/event-stream"), stream.text[:300]
    assert not stream.problems, stream.problems
    for chunk in stream.chunks:
        assert chunk.get("object") == "chat.completion.chunk", chunk
        SdkChunk.model_validate(chunk)
    calls = reassemble_tool_calls(stream.chunks)   # index present, 0..N-1, first delta id/type/name
    assert calls, f"tool_choice required streamed no call; content {stream.content()!r}"
    for call in calls:
        assert call["name"] == "write_file"
        validator(schema).validate(parsed_arguments(call["arguments"]))
    assert stream.choice_chunks(0)[-1]["finish_reason"] == "tool_calls"
    assert whole.status_code == 200, whole.text
    message = SdkChatCompletion.model_validate(whole.json()).choices[0].message
    assert message_calls(message) == [(c["name"], json.loads(c["arguments"])) for c in calls]


def test_case001_neighbours_n2_and_single_call(batch):
    """Every choice numbers its own calls from 0, ids are unique in the whole response, and with
    parallel_tool_calls false exactly one call (index 0) is streamed."""
    schema = case_body("001")["tools"][0]["function"]["parameters"]
    two, single = batch["001n/n2"], batch["001n/single"]
    for sse in (two, single):
        assert sse.status == 200 and not sse.problems, (sse.text[:300], sse.problems)
    ids = []
    for choice in (0, 1):
        calls = reassemble_tool_calls(two.chunks, choice)
        assert calls, f"choice {choice} streamed no call"
        for call in calls:
            validator(schema).validate(parsed_arguments(call["arguments"]))
        ids += [c["id"] for c in calls]
        assert two.finish_reasons(choice) == ["tool_calls"]
    assert len(ids) == len(set(ids)), f"ids repeat across choices: {ids}"
    calls = reassemble_tool_calls(single.chunks)
    assert [c["index"] for c in calls] == [0], calls
    validator(schema).validate(parsed_arguments(calls[0]["arguments"]))


# --- 003 -----------------------------------------------------------------------------------------------

def _tools_003() -> list[dict[str, Any]]:
    return case_body("003")["tools"] + [
        {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                         "required": ["city"], "additionalProperties": False}}},
        {"type": "function", "function": {"name": "get_time", "description": "The current time"}},
    ]


def _jobs_003(server) -> dict[str, Callable[[], Any]]:
    body = case_body("003")
    fn = body["tools"][0]["function"]
    client = server.client(timeout=600)
    named = {"model": "default", "max_tokens": 64, "tools": _tools_003(),
             "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
             "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    other = {**named, "tool_choice": {"type": "function", "function": {"name": "search_kb"}}}
    return {
        "003/stream": lambda: post_sse(chat_url(server), body),
        "003/whole": lambda: post(chat_url(server), {**body, "stream": False}),
        "003n/stream": lambda: sdk_stream(client, **named),
        "003n/whole": lambda: client.chat.completions.create(**named),
        "003n/other": lambda: sdk_stream(client, **other),
        "003r/response": lambda: client.responses.create(
            model="default", input="Hello", max_output_tokens=128,
            tools=[{"type": "function", "name": fn["name"], "parameters": fn["parameters"], "strict": None}],
            tool_choice={"type": "function", "name": fn["name"]}),
    }


def test_case003_named_tool_choice_streams_standard_deltas(batch):
    body = case_body("003")
    fn = body["tools"][0]["function"]
    stream, whole = batch["003/stream"], batch["003/whole"]
    assert stream.status == 200, stream.text[:300]
    assert not stream.problems, stream.problems          # [DONE] last, no `error` payload
    calls = reassemble_tool_calls(stream.chunks)          # name/id/type only on each index's first delta
    assert calls, "a named tool_choice streamed no call"
    for call in calls:
        assert call["name"] == fn["name"]
        validator(fn["parameters"]).validate(parsed_arguments(call["arguments"]))
    assert no_content(stream), stream.content()
    finish = stream.choice_chunks(0)[-1]["finish_reason"]
    assert finish in ("stop", "tool_calls")
    assert whole.status_code == 200, whole.text
    choice = SdkChatCompletion.model_validate(whole.json()).choices[0]
    assert choice.message.tool_calls and all(c.function.name == fn["name"] for c in choice.message.tool_calls)
    for _, arguments in message_calls(choice.message):
        validator(fn["parameters"]).validate(arguments)
    assert choice.finish_reason == finish


def test_case003_neighbours_named_choice_among_several_tools(batch):
    """The named function is called even when the prompt asks for another tool, a parameterless one
    gets `{}`, through the openai client, streamed and whole."""
    streamed, whole, other = batch["003n/stream"], batch["003n/whole"], batch["003n/other"]
    assert streamed["content"][0] == "" and streamed["calls"][0]
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed["calls"][0]] == \
        [("get_time", {})] * len(streamed["calls"][0])
    assert message_calls(whole.choices[0].message) == [("get_time", {})] * len(whole.choices[0].message.tool_calls)
    assert streamed["finish"][0] == [whole.choices[0].finish_reason]
    assert other["calls"][0] and all(c["name"] == "search_kb" for c in other["calls"][0])
    for call in other["calls"][0]:
        validator(_tools_003()[0]["function"]["parameters"]).validate(json.loads(call["arguments"]))


def test_case003_responses_variant(batch):
    fn = case_body("003")["tools"][0]["function"]
    error = batch.error("003r/response")
    if isinstance(error, openai.BadRequestError):
        assert error.body["param"] == "tool_choice", error.body
        return
    response = batch["003r/response"]
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls, f"named tool_choice returned no function_call: {response.output}"
    for item in calls:
        assert item.name == fn["name"]
        validator(fn["parameters"]).validate(parsed_arguments(item.arguments))


# --- 004 -----------------------------------------------------------------------------------------------

def check_required_calls(sse, tools: list[dict[str, Any]], choice: int = 0) -> list[dict[str, Any]]:
    """At least one call, names among `tools`, arguments a JSON object valid against the tool's
    schema (a tool without parameters gets `{}`), no content, finish_reason tool_calls."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools}
    calls = reassemble_tool_calls(sse.chunks, choice)
    assert calls, f"choice {choice}: required tool_choice streamed no call; content {sse.content(choice)!r}"
    for call in calls:
        assert call["name"] in schemas, call
        assert call["arguments"], f"empty arguments string: {call}"
        arguments = parsed_arguments(call["arguments"])
        validator(schemas[call["name"]]).validate(arguments)
        if not schemas[call["name"]].get("properties"):
            assert arguments == {}, f"{call['name']} takes no parameters but got {arguments}"
    assert no_content(sse, choice), sse.content(choice)
    assert sse.finish_reasons(choice) == ["tool_calls"]
    return calls


def _jobs_004(server) -> dict[str, Callable[[], Any]]:
    body = case_body("004")
    sampled = case_body("004", temperature=0.9, seed=11, max_tokens=96)   # a call needs ~30
    return {
        "004/stream": lambda: post_sse(chat_url(server), body),
        "004/whole": lambda: post(chat_url(server), {**body, "stream": False}),
        "004n/n2": lambda: post_sse(chat_url(server), {**sampled, "n": 2}),
        "004n/single": lambda: post_sse(chat_url(server), {**sampled, "parallel_tool_calls": False}),
        "004n/logprobs": lambda: post_sse(chat_url(server), {**sampled, "logprobs": True, "top_logprobs": 2}),
        "004n/continuous": lambda: post_sse(chat_url(server), {
            **sampled, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
        "004n/whole_n2": lambda: post(chat_url(server), {**sampled, "n": 2, "stream": False}),
    }


def test_case004_required_tool_choice_stream_does_not_crash(batch):
    body = case_body("004")
    stream, whole = batch["004/stream"], batch["004/whole"]
    assert stream.status == 200, stream.text[:300]
    assert not stream.problems, stream.problems           # [DONE] last, no `error` payload
    with_choices = [i for i, c in enumerate(stream.chunks) if c.get("choices")]
    assert stream.chunks[with_choices[-1]]["choices"][-1]["finish_reason"] == "tool_calls"
    tail = stream.chunks[with_choices[-1] + 1:]
    assert len(tail) == 1 and tail[0]["choices"] == [] and tail[0]["usage"], tail
    assert [c for c in stream.chunks if c.get("choices") == []] == tail
    assert whole.status_code == 200, whole.text
    choice = SdkChatCompletion.model_validate(whole.json()).choices[0]
    assert choice.message.tool_calls and choice.finish_reason == "tool_calls"
    names = {t["function"]["name"] for t in body["tools"]}
    assert all(name in names and isinstance(args, dict) for name, args in message_calls(choice.message))
    check_required_calls(stream, body["tools"])           # get_time, which has no parameters, gets {}


def test_case004_neighbours_required_on_other_stream_paths(batch):
    """n=2, parallel_tool_calls false, logprobs (no jump-forward) and continuous usage: every path
    streams well-formed calls without an error event; n=2 whole too."""
    tools = case_body("004")["tools"]
    whole = batch["004n/whole_n2"]
    assert whole.status_code == 200, whole.text
    for choice in SdkChatCompletion.model_validate(whole.json()).choices:
        assert choice.message.tool_calls and choice.finish_reason == "tool_calls", choice
    failures = []
    for name in ("n2", "single", "logprobs", "continuous"):
        sse = batch[f"004n/{name}"]
        assert sse.status == 200 and not sse.problems, (name, sse.text[:300], sse.problems)
        for choice in range(2 if name == "n2" else 1):
            try:
                calls = check_required_calls(sse, tools, choice)
                assert name != "single" or len(calls) == 1, calls
            except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
                failures.append((name, choice, str(exc)[:300]))
    assert not failures, failures


# --- 005 -----------------------------------------------------------------------------------------------

_CALL_BLOCK = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def complete_call_blocks(content: str | None) -> list[str]:
    """Well-formed hermes call blocks (JSON with name and arguments) still inside `content`."""
    blocks = []
    for match in _CALL_BLOCK.finditer(content or ""):
        try:
            value = json.loads(match.group(1))
        except ValueError:
            continue
        if isinstance(value, dict) and "name" in value and ("arguments" in value or "parameters" in value):
            blocks.append(match.group(0))
    return blocks


def check_lossless(content: str | None, calls: list, finish: str, completion_tokens: int) -> None:
    if completion_tokens > 0:
        assert content or calls, "tokens were generated but the message is empty"
    assert not complete_call_blocks(content), f"a well-formed call block stayed in content: {content!r}"
    assert finish == ("tool_calls" if calls else finish), (finish, calls)
    if not calls:
        assert finish in ("stop", "length"), finish


_PROMPT_005B = "Call get_weather for Paris, then tell me a one-line joke about rain."


def _jobs_005(server) -> dict[str, Callable[[], Any]]:
    client = server.client(timeout=600)
    body = case_body("005")
    other = case_body("005", messages=[{"role": "user", "content": _PROMPT_005B}], max_tokens=96)
    usage = {"include_usage": True}
    return {
        "005/whole": lambda: client.chat.completions.create(**body),
        "005/stream": lambda: sdk_stream(client, **body, stream_options=usage),
        "005n/whole": lambda: client.chat.completions.create(**other),
        "005n/stream": lambda: sdk_stream(client, **other, stream_options=usage),
    }


def test_case005_text_around_a_call_is_kept(batch):
    for prefix in ("005", "005n"):
        whole, streamed = batch[f"{prefix}/whole"], batch[f"{prefix}/stream"]
        message, finish = whole.choices[0].message, whole.choices[0].finish_reason
        calls = message_calls(message)
        check_lossless(message.content, calls, finish, whole.usage.completion_tokens)
        s_calls = [(c["name"], json.loads(c["arguments"])) for c in streamed["calls"].get(0, [])]
        check_lossless(streamed["content"].get(0, ""), s_calls, streamed["finish"][0][-1],
                       streamed["usage"].completion_tokens)
        assert streamed["content"].get(0, "") == (message.content or ""), prefix
        assert s_calls == calls, prefix
        assert streamed["finish"][0] == [finish], prefix


def _parse_whole(parser_class, tools, text):
    result = parser_class(tools).parse(text)
    return result.content, [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


def _parse_by_char(parser_class, tools, text):
    parser = parser_class(tools)
    result = ParseResult()
    for ch in text:
        result.extend(parser.feed(ch))
    result.extend(parser.finish())
    assert [d.index for d in result.deltas if d.id is not None] == list(range(len(result.tool_calls)))
    return result.content, [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


def test_case005_parser_keeps_text_around_a_call():
    """Parser level, for the served format (the server's default --tool-call-parser), whole and fed
    one character at a time."""
    parser_class = get_tool_parser(ServerConfig().tool_call_parser)
    tools = [ToolSpec(name="get_weather", parameters=case_body("005")["tools"][0]["function"]["parameters"])]
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Dublin"}}\n</tool_call>'
    call = ("get_weather", {"city": "Dublin"})
    # malformed before its header (name, then the arguments' "{") was written: content, verbatim
    malformed = '<tool_call>\n{"arguments": {"city": }, "name": "get_weather"}\n</tool_call>'
    for parse in (_parse_whole, _parse_by_char):
        assert parse(parser_class, tools, "Let me check." + block) == ("Let me check.", [call])
        assert parse(parser_class, tools, "Let me check.\n" + block + "\n") == ("Let me check.", [call])
        content, calls = parse(parser_class, tools, "Let me check." + block + " It is raining.")
        assert calls == [call] and content.startswith("Let me check.") and content.endswith("It is raining.")
        content, calls = parse(parser_class, tools, "First." + block + "Second." + block + "Third.")
        assert calls == [call, call], calls
        assert 0 <= content.index("First.") < content.index("Second.") < content.index("Third."), content
        content, calls = parse(parser_class, tools, "Let me check. " + malformed + " Bye.")
        assert calls == [] and malformed in content and content.startswith("Let me check."), content
        assert content.endswith("Bye."), content
        content, calls = parse(parser_class, tools, "I will use <tool_")
        assert calls == [] and content == "I will use <tool_", content
    # malformed after its header streamed: still a call, its arguments the model's text verbatim
    broken = parser_class(tools).parse('Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n'
                                       "</tool_call> Bye.")
    assert [(c.name, c.arguments) for c in broken.tool_calls] == [("get_weather", '{"city": }')]
    assert broken.content == "Let me check.\nBye."

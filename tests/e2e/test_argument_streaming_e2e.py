"""Issue 14 items 1 and 6 end to end on SmolLM2 (the shared server): a forced call with a long string
argument streams its arguments as generated, through the official openai client (chat deltas, and
Responses events assembled by the SDK's stream helper); the fragments add up to arguments that
validate; stream equals non-stream at temperature 0; /metrics times the first tool-call delta.
(Anthropic's input_json_delta is checked on the Messages server, tests/e2e/test_messages_e2e.py.)"""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.e2e.cases_support import metric
from tests.e2e.conftest import MODEL

pytestmark = pytest.mark.slow

NOTE_SCHEMA = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
                                                "text": {"type": "string", "maxLength": 300}},
               "required": ["title", "text"], "additionalProperties": False}
NOTE = {"type": "function", "function": {"name": "write_note", "description": "Save a note.",
                                         "parameters": NOTE_SCHEMA}}
ASK = "Write a note describing a sunny day at the beach in Dublin."


def test_chat_arguments_stream_as_fragments_and_equal_the_whole_answer(server):
    client = server.client()
    before = metric(server.url, "time_to_first_tool_call_delta_seconds_count")
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": ASK}], tools=[NOTE], tool_choice="required",
                  temperature=0, max_tokens=100)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    deltas = [d for c in chunks for ch in c.choices for d in ch.delta.tool_calls or []]
    header, fragments = deltas[0], deltas[1:]
    assert header.index == 0 and header.id.startswith("call_") and header.type == "function"
    assert header.function.name == "write_note" and header.function.arguments == ""
    assert len(fragments) > 1 and all(d.id is None and d.function.name is None for d in fragments)
    arguments = "".join(d.function.arguments for d in fragments)
    jsonschema.validate(json.loads(arguments), NOTE_SCHEMA)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    whole = client.chat.completions.create(**kwargs).choices[0]
    [call] = whole.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("write_note", arguments)
    assert metric(server.url, "time_to_first_tool_call_delta_seconds_count") == before + 2


def test_responses_argument_events_assemble_to_the_whole_answer(server):
    client = server.client()
    tool = {"type": "function", "name": "write_note", "description": "Save a note.", "parameters": NOTE_SCHEMA}
    kwargs = dict(model=MODEL, input=ASK, tools=[tool], tool_choice="required", parallel_tool_calls=False,
                  temperature=0, max_output_tokens=200)   # room for the call to end: a "completed" response
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    [item] = [i for i in final.output if i.type == "function_call"]
    assert len(deltas) > 1 and "".join(deltas) == done.arguments == item.arguments
    jsonschema.validate(json.loads(item.arguments), NOTE_SCHEMA)
    added = [e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert len(added) == 1 and added[0].item.arguments == "" and events.index(added[0]) < events.index(done)
    whole = client.responses.create(**kwargs)
    [whole_item] = [i for i in whole.output if i.type == "function_call"]
    assert (whole_item.name, whole_item.arguments) == (item.name, item.arguments) == ("write_note", item.arguments)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"], "additionalProperties": False}}}


def test_the_header_and_the_arguments_start_go_out_once_the_name_is_decided(server):
    """Two tools, so the grammar does not force the name: the header goes out with the engine output
    that decided it (the prefill's, the forced `<tool_call>\\n{"name": "` having run in it), and so
    does the arguments' first fragment: after the name's first token the grammar forces the rest
    of the call's envelope and, the arguments having no free whitespace, `{"KEY":` for the tool's
    first required key (before the fixed layout the model wrote ` {` in the next output, then
    `\\n  "city"`); the answer equals the whole one."""
    client = server.client()
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "What is the weather in Dublin?"}],
                  tools=[NOTE, WEATHER], tool_choice="required", temperature=0, max_tokens=40)
    chunks = list(client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    calls = [(c.usage.completion_tokens, d) for c in chunks for ch in c.choices for d in ch.delta.tool_calls or []]
    (header_tokens, header), (fragment_tokens, fragment) = calls[0], calls[1]
    assert header.id is not None and header.function.name in ("write_note", "get_weather")
    first_key = {"write_note": "title", "get_weather": "city"}[header.function.name]
    # exactly `{"KEY":` unless the stream merged the next engine output into this one (a busy box)
    assert header.function.arguments == "" and fragment.function.arguments.startswith(f'{{"{first_key}":')
    first_output = next(c.usage.completion_tokens for c in chunks if c.usage is not None)
    assert header_tokens == fragment_tokens == first_output, "header and fragment are in the first engine output"
    arguments = "".join(d.function.arguments or "" for _, d in calls)
    [call] = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == (header.function.name, arguments)

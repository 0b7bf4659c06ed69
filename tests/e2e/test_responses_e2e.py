"""Issue 5 end to end: /v1/responses on SmolLM2 through the official `openai` client and the
openai-agents SDK: whole and streamed responses, function-tool loops (stored and stateless),
text.format, parse(), retrieve/delete/input_items, a restart on the same store, and the errors."""

from __future__ import annotations

import json
import os

import jsonschema
import openai
import pytest
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseStreamEvent,
    ResponseTextDeltaEvent,
)
from pydantic import BaseModel

from tests.e2e.conftest import MODEL, ROOT, start_server, stop_server

pytestmark = pytest.mark.slow

QUESTION = "Name three colours of the rainbow."
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


class Person(BaseModel):
    name: str
    age: int


def test_whole_and_streamed_agree(server):
    client = server.client()
    whole = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=16, temperature=0)
    assert whole.id.startswith("resp_") and whole.model == MODEL and whole.output_text
    assert whole.status in ("completed", "incomplete") and whole.usage.output_tokens <= 16
    assert whole.usage.total_tokens == whole.usage.input_tokens + whole.usage.output_tokens
    events: list[ResponseStreamEvent] = list(
        client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=16, temperature=0, stream=True)
    )
    assert isinstance(events[0], ResponseCreatedEvent) and isinstance(events[1], ResponseInProgressEvent)
    assert isinstance(events[-1], (ResponseCompletedEvent, ResponseIncompleteEvent))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert isinstance(events[2], ResponseOutputItemAddedEvent)
    assert sum(isinstance(e, ResponseOutputItemDoneEvent) for e in events) == len(events[-1].response.output)
    streamed = "".join(e.delta for e in events if isinstance(e, ResponseTextDeltaEvent))
    assert streamed == whole.output_text == events[-1].response.output_text
    assert events[-1].response.status == whole.status


def _forced_call(client, **kwargs):
    first = client.responses.create(
        model=MODEL,
        input=kwargs.pop("input", "What is the weather in Paris?"),
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
        temperature=0,
        **kwargs,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1, first.output
    assert calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_TOOL["parameters"])
    return first, calls[0]


def test_tool_loop_with_previous_response_id(server):
    client = server.client()
    first, call = _forced_call(client)
    final = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}],
        max_output_tokens=24,
        temperature=0,
    )
    assert final.previous_response_id == first.id and final.output_text
    assert [item.type for item in final.output] == ["message"]


def test_tool_loop_with_full_input_and_store_false(server):
    client = server.client()
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    first, call = _forced_call(client, input=question, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    history = [
        *question,
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ]
    final = client.responses.create(
        model=MODEL,
        input=history,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        store=False,
        max_output_tokens=24,
        temperature=0,
    )
    assert final.output_text and final.store is False


def test_text_format_json_schema_validates(server):
    client = server.client()
    out = client.responses.create(
        model=MODEL,
        input="Describe a person as JSON.",
        max_output_tokens=60,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
    )
    assert out.status == "completed", out
    jsonschema.validate(json.loads(out.output_text), PERSON)
    parsed = client.responses.parse(
        model=MODEL, input="Describe a person.", text_format=Person, max_output_tokens=60, temperature=0
    )
    assert isinstance(parsed.output_parsed, Person)


def test_retrieve_input_items_delete_and_restart(server, tmp_path):
    client = server.client()
    created = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "Hi!"}],
        instructions="Be brief.",
        max_output_tokens=8,
        temperature=0,
    )
    assert client.responses.retrieve(created.id).output_text == created.output_text
    items = client.responses.input_items.list(created.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "Hi!")]
    doomed = client.responses.create(model=MODEL, input="Bye", max_output_tokens=4, temperature=0)
    client.responses.delete(doomed.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(doomed.id)
    # the shared server stores in its default file; a new server process on that file still has it
    second = start_server(tmp_path, "--responses-db", str(ROOT / "data" / "responses.sqlite3"))
    try:
        again = second.client().responses.retrieve(created.id)
        assert again.id == created.id and again.output_text == created.output_text
        follow = second.client().responses.create(
            model=MODEL, input="Again?", previous_response_id=created.id, max_output_tokens=4, temperature=0
        )
        assert follow.previous_response_id == created.id
    finally:
        stop_server(second)


def test_agents_sdk_responses_model_runs_a_tool_loop(server):
    os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather of a city."""
        calls.append(city)
        return f"sunny in {city}"

    model = OpenAIResponsesModel(
        model=MODEL,
        openai_client=openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0),
    )
    agent = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, max_tokens=40, temperature=0
        ),
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    assert len(calls) >= 1 and isinstance(result.final_output, str) and result.final_output


def test_errors(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as bad_item:
        client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": "msg_1"}])
    assert bad_item.value.body["param"] == "input[0].type" and "item_reference" in bad_item.value.message
    with pytest.raises(openai.BadRequestError):
        client.responses.create(
            model=MODEL, input=[{"type": "function_call_output", "call_id": "call_x", "output": "1"}]
        )
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_unknown")
    assert missing.value.body["code"] == "previous_response_not_found"
    for tool in (
        {"type": "web_search"},
        {"type": "file_search", "vector_store_ids": ["v"]},
        {"type": "mcp", "server_label": "s", "server_url": "http://x"},
    ):
        with pytest.raises(openai.BadRequestError) as unsupported:
            client.responses.create(model=MODEL, input="Hi", tools=[tool])
        assert tool["type"] in unsupported.value.message


def test_background_polls_to_completed_and_cancel_stops_a_running_one(server):
    """background: true on SmolLM2: queued/in_progress while polling, then done with the same status
    and greedy answer as a foreground call; a long one cancelled while running ends cancelled, stays so."""
    import time

    client = server.client()
    foreground = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0)
    job = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0, background=True)
    assert job.status in ("queued", "in_progress") and job.background
    seen = [job.status]
    deadline = time.monotonic() + 120
    while seen[-1] in ("queued", "in_progress"):
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)
        seen.append(client.responses.retrieve(job.id).status)
    assert seen[-1] == foreground.status and foreground.status in ("completed", "incomplete"), seen
    assert client.responses.retrieve(job.id).output_text == foreground.output_text

    long = client.responses.create(model=MODEL, input="Write a long story about a lighthouse keeper.",
                                   max_output_tokens=1000, temperature=0, background=True)
    while client.responses.retrieve(long.id).status == "queued":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    time.sleep(1.0)
    final = client.responses.retrieve(long.id)
    assert final.status == "cancelled" and (final.usage is None or final.usage.output_tokens < 1000)

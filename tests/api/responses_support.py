"""Test support for the /v1/responses tests: tools in Responses shape, scripted tool-call text,
typed-SSE parsing and the event-lifecycle check of case 020. (Named uniquely: tests/ has no
__init__.py.)"""

from __future__ import annotations

import json
from typing import Any

from api_support import FakeEngine

from engine.request import EngineRequest

GET_WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
GET_TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
TERMINAL = ("response.completed", "response.incomplete", "response.failed")


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """The hermes text of one tool call, as the model writes it."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def play(engine: FakeEngine, *texts: str) -> None:
    """Request k (0-based, in submission order) answers texts[min(k, last)]."""

    def script(request: EngineRequest, index: int) -> str:
        k = engine.requests.index(request)
        return texts[min(k, len(texts) - 1)]

    engine.script_for = script


def prompt_of(engine: FakeEngine, k: int = -1) -> str:
    """The decoded prompt of submitted request k."""
    return engine.tokenizer.decode(engine.requests[k].prompt_token_ids)


def typed_events(text: str) -> list[dict[str, Any]]:
    """The events of a Responses SSE body: each block is `event: <type>` + `data: <json>` with the
    same type (asserted); no [DONE]."""
    assert text.endswith("\n\n"), repr(text[-20:])
    events = []
    for block in text.split("\n\n")[:-1]:
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        data = json.loads(lines[1][len("data: ") :])
        assert data["type"] == lines[0][len("event: ") :]
        events.append(data)
    return events


def check_lifecycle(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Assert the expectations of case 020 on plain event dicts; return the terminal response."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress"
    assert events[-1]["type"] in TERMINAL
    assert not any(e["type"] in TERMINAL for e in events[:-1])
    added: dict[int, dict[str, Any]] = {}
    done: dict[int, dict[str, Any]] = {}
    texts: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for event in events[2:-1]:
        kind, index = event["type"], event.get("output_index")
        if kind == "error":
            continue
        if kind == "response.output_item.added":
            assert index == len(added) and index not in added
            added[index] = event["item"]
            continue
        assert index in added and index not in done, event  # refers to an open item
        item_id = added[index]["id"]
        if kind == "response.output_item.done":
            assert event["item"]["id"] == item_id
            done[index] = event["item"]
        elif kind == "response.output_text.delta":
            assert event["item_id"] == item_id and event["content_index"] == 0
            texts[index] = texts.get(index, "") + event["delta"]
        elif kind == "response.output_text.done":
            assert event["text"] == texts.get(index, "")
        elif kind == "response.function_call_arguments.delta":
            arguments[index] = arguments.get(index, "") + event["delta"]
        elif kind == "response.function_call_arguments.done":
            assert event["arguments"] == arguments.get(index, "")   # the fragments add up to it
        else:
            assert kind in ("response.content_part.added", "response.content_part.done"), kind
    assert sorted(done) == sorted(added)
    response = events[-1]["response"]
    assert response["output"] == [done[i] for i in sorted(done)]
    for index, item in done.items():
        if item["type"] == "message":
            assert item["content"][0]["text"] == texts.get(index, "")
        else:
            assert item["arguments"] == arguments.get(index, "") and item["call_id"]
    return response


def without_ids(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items without their random ids (item id, call_id), to compare two responses."""
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in output]

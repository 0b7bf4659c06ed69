"""Responses-stream checks for the acceptance cases (020 and the Responses variants): read a
`/v1/responses` SSE body byte-exactly, and check every item's event lifecycle as SHAPES.md §3 and
case 020 state it, the event shapes against the OpenAI SDK's types, and stream == whole.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pydantic
from openai.types.responses import ResponseStreamEvent

from tests.e2e.cases_support import HTTP

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
_SDK_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)


@dataclass
class TypedSse:
    """A streamed Responses body: status, content type, raw text, events (JSON objects, in order)
    and framing problems."""

    status: int
    content_type: str
    text: str
    events: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def post_typed_sse(url: str, body: dict[str, Any], timeout: float = 300.0) -> TypedSse:
    """POST a streamed Responses request and read it to its end (non-200: text only)."""
    with HTTP.stream("POST", url, json={**body, "stream": True}, timeout=timeout) as r:
        result = TypedSse(r.status_code, r.headers.get("content-type", ""), r.read().decode("utf-8"))
    if result.status == 200:
        result.events, result.problems = parse_typed_sse(result.text)
    return result


def parse_typed_sse(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(events, framing problems): each event an optional `event: <type>` line naming the data's
    `type` and one `data: <json object>` line, then a blank line; `:` comments allowed; after the
    terminal event nothing but an optional `data: [DONE]`."""
    problems: list[str] = []
    if not text.endswith(("\n\n", "\r\n\r\n", "\r\r")):
        problems.append(f"the body does not end with a blank line: {text[-40:]!r}")
    events: list[dict[str, Any]] = []
    terminal = done = False
    for n, block in enumerate(re.split(r"(?:\r\n|\r|\n){2}", text.strip("\r\n"))):
        lines = [line for line in re.split(r"\r\n|\r|\n", block) if not line.startswith(":")]
        if not lines:
            continue
        names = [line[6:].strip() for line in lines if line.startswith("event:")]
        data = [line[5:].removeprefix(" ") for line in lines if line.startswith("data:")]
        if len(data) != 1 or len(names) > 1 or len(names) + len(data) != len(lines):
            problems.append(f"block {n} is not one optional event line plus one data line: {block[:120]!r}")
            continue
        if data[0] == "[DONE]":
            if not terminal:
                problems.append(f"block {n}: data: [DONE] before the terminal event")
            done = True
            continue
        if done or terminal:
            problems.append(f"block {n}: an event after the terminal event: {block[:120]!r}")
        try:
            event = json.loads(data[0])
        except ValueError:
            problems.append(f"block {n}: data is not JSON: {data[0][:80]!r}")
            continue
        if not isinstance(event, dict):
            problems.append(f"block {n}: data is not a JSON object: {data[0][:80]!r}")
            continue
        if names and names[0] != event.get("type"):
            problems.append(f"block {n}: event: {names[0]!r} but type {event.get('type')!r}")
        terminal = terminal or event.get("type") in TERMINAL
        events.append(event)
    return events, problems


# (item type, state, event type) -> next state; "done" once output_item.done was seen
_NEXT = {
    ("message", "added", "response.content_part.added"): "part",
    ("message", "part", "response.output_text.delta"): "part",
    ("message", "part", "response.output_text.done"): "text_done",
    ("message", "text_done", "response.content_part.done"): "part_done",
    ("message", "part_done", "response.output_item.done"): "done",
    ("function_call", "added", "response.function_call_arguments.delta"): "added",
    ("function_call", "added", "response.function_call_arguments.done"): "args_done",
    ("function_call", "args_done", "response.output_item.done"): "done",
}


@dataclass
class _Item:
    added: dict[str, Any]
    state: str = "added"
    text: str = ""                # concatenated output_text / arguments deltas
    done: dict[str, Any] | None = None


def _added_problems(event: dict[str, Any], index: int) -> list[str]:
    item = event.get("item") or {}
    problems = []
    if event.get("output_index") != index:
        problems.append(f"output_index {event.get('output_index')}, expected the next one, {index}")
    if not isinstance(item.get("id"), str) or not item["id"] or item.get("status") != "in_progress":
        problems.append(f"added item needs an id and status in_progress: {item}")
    if item.get("type") == "function_call":
        if not item.get("name") or not item.get("call_id") or item.get("arguments") != "":
            problems.append(f"added function_call needs name, call_id and arguments '': {item}")
    elif item.get("type") == "message":
        if item.get("content") != [] or item.get("role") != "assistant":
            problems.append(f"added message needs role assistant and empty content: {item}")
    else:
        problems.append(f"unexpected item type {item.get('type')!r}")
    return problems


def _event_problems(item: _Item, event: dict[str, Any]) -> list[str]:
    kind, added = event["type"], item.added["item"]
    problems = []
    if "item_id" in event and event["item_id"] != added["id"]:
        problems.append(f"item_id {event['item_id']!r} is not the added item's {added['id']!r}")
    if "content_index" in event and event["content_index"] != 0:
        problems.append(f"content_index {event['content_index']}")
    if kind in ("response.output_text.delta", "response.function_call_arguments.delta"):
        item.text += event.get("delta", "")
    elif kind == "response.content_part.added" and (event.get("part") or {}).get("text") != "":
        problems.append(f"content_part.added with text: {event.get('part')}")
    elif kind == "response.output_text.done" and event.get("text") != item.text:
        problems.append(f"text {event.get('text')!r} != the deltas {item.text!r}")
    elif kind == "response.content_part.done" and (event.get("part") or {}).get("text") != item.text:
        problems.append(f"content_part.done text {event.get('part')} != the deltas {item.text!r}")
    elif kind == "response.function_call_arguments.done" and event.get("arguments") != item.text:
        problems.append(f"arguments {event.get('arguments')!r} != the deltas {item.text!r}")
    elif kind == "response.output_item.done":
        item.done = done = event.get("item") or {}
        same = ("id", "type", "call_id", "name") if added["type"] == "function_call" else ("id", "type", "role")
        if any(done.get(key) != added.get(key) for key in same):
            problems.append(f"done item {done} does not match the added item {added}")
        if done.get("status") not in ("completed", "incomplete"):
            problems.append(f"done item status {done.get('status')!r}")
        content = done.get("arguments") if added["type"] == "function_call" else \
            [part.get("text") for part in done.get("content") or []]
        if content != (item.text if added["type"] == "function_call" else [item.text]):
            problems.append(f"done item content {content!r} != the deltas {item.text!r}")
    return problems


def lifecycle_problems(events: list[dict[str, Any]]) -> list[str]:
    """What breaks case 020's lifecycle rules: numbering 0, 1, 2, ...; created and in_progress
    first (status in_progress); exactly one terminal event, last; every item added in output_index
    order, its events in order (message: content_part.added, output_text.delta*, output_text.done,
    content_part.done; function_call: arguments delta*, arguments done) with texts equal to the
    joined deltas, then exactly one output_item.done of the same item; the terminal response's
    output equal to the done items by output_index."""
    problems: list[str] = []
    numbers = [e.get("sequence_number") for e in events]
    if any(type(n) is not int for n in numbers) or numbers != list(range(len(events))):
        problems.append(f"sequence_numbers are not 0, 1, 2, ...: {numbers}")
    types = [e.get("type") for e in events]
    if types[:2] != ["response.created", "response.in_progress"] or \
            any((e.get("response") or {}).get("status") != "in_progress" for e in events[:2]):
        return [*problems, f"the stream does not open with created, in_progress (in_progress): {types[:3]}"]
    if types[-1] not in TERMINAL or any(t in TERMINAL for t in types[:-1]):
        return [*problems, f"not exactly one terminal event, last: {types}"]
    items: dict[int, _Item] = {}
    for n, event in enumerate(events[2:-1], start=2):
        kind, index = event.get("type"), event.get("output_index")
        where = f"event {n} {kind} (output_index {index})"
        if kind == "response.output_item.added":
            problems += [f"{where}: {p}" for p in _added_problems(event, len(items))]
            items[len(items)] = _Item(event)
            continue
        item = items.get(index) if isinstance(index, int) else None
        state = _NEXT.get((item.added["item"].get("type"), item.state, kind)) if item is not None else None
        if item is None or state is None:
            problems.append(f"{where}: out of order (item state {item.state if item else 'not added'})")
            continue
        item.state = state
        problems += [f"{where}: {p}" for p in _event_problems(item, event)]
    problems += [f"output_index {k}: added but never done" for k, item in items.items() if item.state != "done"]
    output = (events[-1].get("response") or {}).get("output")
    if output != [items[k].done for k in sorted(items)]:
        problems.append(f"terminal output {output} != the done items")
    return problems


def sdk_problems(events: list[dict[str, Any]]) -> list[str]:
    """Events that do not validate as the OpenAI SDK's ResponseStreamEvent union."""
    problems = []
    for n, event in enumerate(events):
        try:
            _SDK_EVENT.validate_python(event)
        except pydantic.ValidationError as exc:
            problems.append(f"event {n} {event.get('type')}: {str(exc)[:300]}")
    return problems


def without_ids(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items without their per-response random ids (item id, call_id)."""
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in output]

"""Mistral tool calls after the `[TOOL_CALLS]` marker, in both of Mistral's layouts.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Dublin"}}, ...]     (v3 tokenizers)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Dublin"}                                (v11+ tokenizers)
    [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Dublin"}              (v7-style ids, ignored)

Follows vLLM's `mistral` parser. The marker is a control token: the detokenizer must keep it
(skip_special_tokens=False) for calls to be found. A block that does not parse stays content verbatim.
Streaming (toolparsers/base.py): a call's header goes out once `name[ARGS]{` is written, or, in a
list, once an item has written `{"name": "NAME", "arguments": {`; its arguments then stream as the
model writes them. A list that turns out malformed keeps the calls already streamed (the last one
with the model's text verbatim) and its rest is content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from constrained.compose import tool_calls_grammar
from constrained.structural_tag import StructuralTag, StructuralTagGrammar
from toolparsers.base import Call, OpenCall, Segment, Text, ToolChoice, ToolParser, ToolSpec
from toolparsers.brackets import Memo, find_closing
from toolparsers.call_format import NAME, CallFormat
from toolparsers.json_prefix import JsonObjectPrefix
from toolparsers.scanning import (
    call_from_members,
    header_call_segments,
    json_call_header,
    json_members,
    match_end,
    partial_marker_len,
    skip_ws,
)
from toolparsers.tool_grammar import arguments_schema, resolve_tool_choice, single_call

MARKER = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_DECODER = json.JSONDecoder()
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
_ID = re.compile(r"[A-Za-z0-9]*")


class MistralParser(ToolParser):
    """`[TOOL_CALLS]` followed by a JSON list of calls or by `name[ARGS]{...}` (vLLM name: mistral)."""

    name = "mistral"
    # One call as the v11+ tokenizers write it; the grammar (call_grammar) writes the v3 list instead.
    call_format = CallFormat(f"{MARKER}{NAME}{ARGS}", "", MARKER, "")

    def _scan(self, text: str, final: bool) -> tuple[list[Segment], int]:
        segments: list[Segment] = []
        pos = 0
        while True:
            begin = text.find(MARKER, pos)
            if begin < 0:
                keep = 0 if final else partial_marker_len(text[pos:], [MARKER])
                segments.append(Text(text[pos:len(text) - keep]))
                return segments, len(text) - keep
            segments.append(Text(text[pos:begin]))
            calls, end = _parse_after_marker(text, begin + len(MARKER), self._memo, final)
            if end < 0 and not final:
                return segments, begin
            if calls is not None and end < 0:   # a streamed call the output ended inside
                segments.extend(calls)
                return segments, len(text)
            if calls is None or end < 0:
                # Malformed: the marker is content and scanning goes on right after it.
                segments.append(Text(MARKER))
                pos = begin + len(MARKER)
                continue
            segments.extend(calls)
            pos = end

    def _open_calls(self, text: str) -> list[OpenCall]:
        if not text.startswith(MARKER):
            return []
        j = skip_ws(text, len(MARKER))
        if text.startswith("[", j):
            return _list_open_calls(text, j, self._reader(text))
        header = _v11_header(text, j)
        if header is None:
            return []
        name, start = header
        reader = self._json_prefix(text, start)
        return [OpenCall(name, text[start:reader.safe_end])]

    def _reader(self, text: str) -> _ReaderAt:
        return lambda start: self._json_prefix(text, start)

    def call_grammar(
        self, tools: list[ToolSpec], tool_choice: ToolChoice, parallel_tool_calls: bool = True
    ) -> StructuralTagGrammar | None:
        """Structural tag with one structure: begin `[TOOL_CALLS]`, a JSON array (1 item when not
        parallel or named) of `{"name": <enum of one tool>, "arguments": <its schema>}`, end "",
        in the fixed layout (`[{"name": "NAME", "arguments": {...}}]`, no free whitespace).
        Forced: that one list; auto: free text with lists wherever `[TOOL_CALLS]` appears."""
        allowed, forced = resolve_tool_choice(tools, tool_choice)
        if not allowed:
            return None
        items = [_item_schema(tool) for tool in allowed]
        single = single_call(tool_choice, parallel_tool_calls)
        array: dict[str, Any] = {
            "type": "array",
            "items": items[0] if len(items) == 1 else {"anyOf": items},
            "minItems": 1,
        }
        if single:
            array["maxItems"] = 1
        # A forced output is one list, however many calls it holds.
        tag = StructuralTag(MARKER, array, "", fixed_layout=True)
        return tool_calls_grammar([tag], MARKER, "", forced=forced, single=forced or single)


def _item_schema(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [tool.name]}, "arguments": arguments_schema(tool)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


_ReaderAt = Callable[[int], JsonObjectPrefix]


def _fresh_reader(text: str) -> _ReaderAt:
    def reader_at(start: int) -> JsonObjectPrefix:
        reader = JsonObjectPrefix(start)
        reader.advance(text)
        return reader
    return reader_at


def _v11_header(text: str, j: int) -> tuple[str, int] | None:
    """(name, index of the arguments' "{") of `name[CALL_ID]id[ARGS]{` at `j`; None if not (yet) so."""
    name_end = match_end(_NAME, text, j)
    k = name_end
    if text.startswith(CALL_ID, k):
        k = match_end(_ID, text, k + len(CALL_ID))
    if name_end == j or not text.startswith(ARGS, k):
        return None
    start = skip_ws(text, k + len(ARGS))
    return (text[j:name_end], start) if text.startswith("{", start) else None


@dataclass(frozen=True, slots=True)
class _Item:
    """A list item whose header is written: where it starts, its name, its arguments' reader."""

    start: int
    name: str
    reader: JsonObjectPrefix


def _list_items(text: str, j: int, reader_at: _ReaderAt) -> list[_Item]:
    """The items of the call list at `text[j]` ("[") whose header is written, while the list is well
    formed (each item `{"name": ..., "arguments": {...}}`, then "," or the end)."""
    items: list[_Item] = []
    pos = skip_ws(text, j + 1)
    while (header := json_call_header(text, pos)) is not None:
        reader = reader_at(header[1])
        items.append(_Item(pos, header[0], reader))
        item_end = find_closing(text, pos) if reader.end >= 0 else -1
        if item_end < 0:
            break
        pos = skip_ws(text, item_end)
        if not text.startswith(",", pos):
            break
        pos = skip_ws(text, pos + 1)
    return items


def _list_open_calls(text: str, j: int, reader_at: _ReaderAt) -> list[OpenCall]:
    return [OpenCall(item.name, text[item.reader.start:item.reader.safe_end])
            for item in _list_items(text, j, reader_at)]


def _parse_list_or_streamed(text: str, j: int, end: int) -> list[Segment] | None:
    """The calls of the list `text[j:end]` ("[" ... "]", or to the end of an unfinished output);
    when it is malformed, the calls that streamed (the last one with the model's text verbatim) and
    the rest of the list as content; None when no call streamed either."""
    closed = text.startswith("]", end - 1) and find_closing(text, j) == end
    calls = _parse_list(text[j:end]) if closed else None
    if calls is not None:
        return list(calls)
    stop = end - 1 if closed else end
    items = _list_items(text[:stop], j, _fresh_reader(text[:stop]))
    if not items:
        return None
    segments: list[Segment] = []
    rest_from = stop
    for item in items:
        call = header_call_segments(text, item.start, stop, (item.name, item.reader.start))[0]
        assert isinstance(call, Call)
        segments.append(call)
        item_end = find_closing(text[:stop], item.start)
        rest_from = item_end if item_end >= 0 else item.reader.start + len(call.arguments)
    rest = text[rest_from:stop]
    if rest.strip(" \t\n\r,}]"):
        segments.append(Text(rest))
    return segments


def _parse_after_marker(text: str, pos: int, memo: Memo, final: bool) -> tuple[list[Segment] | None, int]:
    """Calls after a marker ending at `pos` and the index past them; (None, n>=0) when malformed,
    (None, -1) when the text ends before that is known; with `final`, a streamed call the output
    ended inside is returned with end -1."""
    j = skip_ws(text, pos)
    if j == len(text):
        return None, -1
    if text[j] == "[":
        end = find_closing(text, j, memo=memo)
        if end < 0:
            return (_parse_list_or_streamed(text, j, len(text)) if final else None), -1
        segments = _parse_list_or_streamed(text, j, end)
        return segments, end
    header = _v11_header(text, j)
    if header is not None:
        name, start = header
        end = find_closing(text, start, memo=memo)
        stop = end if end >= 0 else len(text)
        if end < 0 and not final:
            return None, -1
        return header_call_segments(text, start, stop, (name, start))[:1], end
    name_end = match_end(_NAME, text, j)
    name = text[j:name_end]
    k = name_end
    if text.startswith(CALL_ID, k):
        k = match_end(_ID, text, k + len(CALL_ID))
    if not text.startswith(ARGS, k):
        rest = text[k:]
        undecided = k == len(text) or ARGS.startswith(rest) or (CALL_ID.startswith(rest) and k == name_end)
        return None, (-1 if undecided else k)
    start = skip_ws(text, k + len(ARGS))
    return None, (-1 if start == len(text) else start)  # no name, or arguments that are not an object


def _parse_list(text: str) -> list[Call] | None:
    try:
        items, end = _DECODER.raw_decode(text)
    except ValueError:
        return None
    if not isinstance(items, list) or not items or end != len(text):
        return None
    calls: list[Call] = []
    pos = 1
    for _ in items:
        start = skip_ws(text, pos)
        _, stop = _DECODER.raw_decode(text, start)
        call = call_from_members(json_members(text[start:stop]), ("arguments", "parameters"))
        if call is None:
            return None
        calls.append(call)
        pos = skip_ws(text, stop) + 1  # past the "," or "]"
    return calls

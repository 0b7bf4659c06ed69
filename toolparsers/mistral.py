"""Mistral tool calls after the `[TOOL_CALLS]` marker, in both of Mistral's layouts.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Dublin"}}, ...]     (v3 tokenizers)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Dublin"}                                (v11+ tokenizers)
    [TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Dublin"}              (v7-style ids, ignored)

Follows vLLM's `mistral` parser. The marker is a control token: the detokenizer must keep it
(skip_special_tokens=False) for calls to be found. A block that does not parse stays content verbatim.
"""

from __future__ import annotations

import json
import re
from typing import Any

from constrained.compose import tool_calls_grammar
from constrained.structural_tag import StructuralTag, StructuralTagGrammar
from toolparsers.base import Call, Segment, Text, ToolChoice, ToolParser, ToolSpec
from toolparsers.brackets import Memo, find_closing
from toolparsers.call_format import NAME, CallFormat
from toolparsers.scanning import (
    arguments_text,
    call_from_members,
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
            calls, end = _parse_after_marker(text, begin + len(MARKER), self._memo)
            if end < 0 and not final:
                return segments, begin
            if calls is None or end < 0:
                # Malformed: the marker is content and scanning goes on right after it.
                segments.append(Text(MARKER))
                pos = begin + len(MARKER)
                continue
            segments.extend(calls)
            pos = end

    def call_grammar(
        self, tools: list[ToolSpec], tool_choice: ToolChoice, parallel_tool_calls: bool = True
    ) -> StructuralTagGrammar | None:
        """Structural tag with one structure: begin `[TOOL_CALLS]`, a JSON array (1 item when not
        parallel or named) of `{"name": <enum of one tool>, "arguments": <its schema>}`, end "".
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
        return tool_calls_grammar([StructuralTag(MARKER, array, "")], MARKER, "", forced=forced,
                                  single=forced or single)


def _item_schema(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [tool.name]}, "arguments": arguments_schema(tool)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _parse_after_marker(text: str, pos: int, memo: Memo) -> tuple[list[Call] | None, int]:
    """Calls after a marker ending at `pos` and the index past them; (None, n>=0) when malformed,
    (None, -1) when the text ends before that is known."""
    j = skip_ws(text, pos)
    if j == len(text):
        return None, -1
    if text[j] == "[":
        end = find_closing(text, j, memo=memo)
        return (_parse_list(text[j:end]), end) if end >= 0 else (None, -1)
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
    if start == len(text):
        return None, -1
    if text[start] != "{" or not name:
        return None, start
    end = find_closing(text, start, memo=memo)
    if end < 0:
        return None, -1
    arguments = _object_text(text[start:end])
    return ([Call(name, arguments)] if arguments is not None else None), end


def _object_text(text: str) -> str | None:
    try:
        value, end = _DECODER.raw_decode(text)
    except ValueError:
        return None
    return arguments_text(value, text) if end == len(text) else None


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

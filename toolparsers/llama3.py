"""Llama 3.x JSON tool calls: `{"name": ..., "parameters": {...}}` objects, optionally after `<|python_tag|>`.

Format (vLLM `llama3_json`; several calls separated by ";", text before and after allowed):

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Dublin"}}; {"name": "get_time", ...}

A call is a JSON object whose first key is "name" (or "type", as Llama 3.2 sometimes writes
`{"type": "function", "name": ...}`) with a string name and an object "parameters" (or "arguments").
Other JSON objects stay content. `<|python_tag|>` is dropped from the content; ";" after a call is a
separator and dropped too.
"""

from __future__ import annotations

import string
from typing import Literal

from toolparsers.base import Segment, Text, ToolParser
from toolparsers.brackets import find_closing
from toolparsers.call_format import NAME_JSON, CallFormat
from toolparsers.scanning import call_from_members, json_members, partial_marker_len, skip_ws

PYTHON_TAG = "<|python_tag|>"
TRIGGER = '{"name": '
_KEYS = ('"name"', '"type"')

StartState = Literal["yes", "maybe", "no"]


class Llama3JsonParser(ToolParser):
    """`{"name": ..., "parameters": {...}}` calls, ";"-separated, optional `<|python_tag|>` (llama3_json)."""

    name = "llama3_json"
    strip_after_call = string.whitespace + ";"
    # The grammar writes `{"name": "NAME", "parameters": ARGS}`, calls joined by "; ".
    call_format = CallFormat(f'{TRIGGER}{NAME_JSON}, "parameters": ', "}", TRIGGER, "; ")

    def _scan(self, text: str, final: bool) -> tuple[list[Segment], int]:
        segments: list[Segment] = []
        pos = 0
        while True:
            start, kind = _next_start(text, pos, final)
            if start < 0:
                keep = 0 if final else partial_marker_len(text[pos:], [PYTHON_TAG])
                segments.append(Text(text[pos:len(text) - keep]))
                return segments, len(text) - keep
            segments.append(Text(text[pos:start]))
            if kind == "maybe":
                return segments, start
            if kind == "tag":
                pos = start + len(PYTHON_TAG)
                continue
            end = find_closing(text, start, memo=self._memo)
            if end < 0:
                if not final:
                    return segments, start
                segments.append(Text(text[start:]))
                return segments, len(text)
            call = call_from_members(json_members(text[start:end]), ("parameters", "arguments"))
            segments.append(call if call is not None else Text(text[start:end]))
            pos = end


def _next_start(text: str, pos: int, final: bool) -> tuple[int, str]:
    """The next place at or after `pos` where a call may start: ("json" | "maybe" | "tag") or (-1, "")."""
    tag = text.find(PYTHON_TAG, pos)
    brace = text.find("{", pos)
    while brace >= 0 and (tag < 0 or brace < tag):
        state = _start_state(text, brace)
        if state == "yes":
            return brace, "json"
        if state == "maybe" and not final:
            return brace, "maybe"
        brace = text.find("{", brace + 1)
    return (tag, "tag") if tag >= 0 else (-1, "")


def _start_state(text: str, brace: int) -> StartState:
    """Whether the "{" at `brace` opens a call object: its first key is "name"/"type" ("maybe" when the
    text ends before that is known)."""
    j = skip_ws(text, brace + 1)
    for key in _KEYS:
        if len(text) - j < len(key):
            if key.startswith(text[j:]):
                return "maybe"
            continue
        if text.startswith(key, j):
            k = skip_ws(text, j + len(key))
            if k == len(text):
                return "maybe"
            return "yes" if text[k] == ":" else "no"
    return "no"

"""Llama 3.x JSON tool calls: `{"name": ..., "parameters": {...}}` objects, optionally after `<|python_tag|>`.

Format (vLLM `llama3_json`; several calls separated by ";", text before and after allowed):

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Dublin"}}; {"name": "get_time", ...}

A call is a JSON object whose first key is "name" (or "type", as Llama 3.2 sometimes writes
`{"type": "function", "name": ...}`) with a string name and an object "parameters" (or "arguments").
Other JSON objects stay content. `<|python_tag|>` is dropped from the content; ";" after a call is a
separator and dropped too. Streaming: once an object has written `{"name": "NAME", "parameters": {`
(under a grammar, `constrained`: once `{"name": "NAME"` is written), the call's header goes out and its arguments stream as the model writes them (toolparsers/base.py).
"""

from __future__ import annotations

import string
from typing import Literal

from toolparsers.base import OpenCall, Segment, Text, ToolParser
from toolparsers.brackets import find_closing
from toolparsers.call_format import NAME_JSON, CallFormat
from toolparsers.scanning import (
    call_from_members,
    cut_decided_call,
    header_call_segments,
    json_call_header,
    json_members,
    open_json_call,
    partial_marker_len,
    skip_ws,
)

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
            if end < 0 and not final:
                return segments, start
            stop = end if end >= 0 else len(text)
            header = json_call_header(text, start)
            if header is not None:
                segments.extend(header_call_segments(text, start, stop, header))
            else:
                call = call_from_members(json_members(text[start:stop]), ("parameters", "arguments")) \
                    if end >= 0 else None
                if end < 0 and self.constrained:   # cut after its name (its header streamed)
                    call = cut_decided_call(text, start, stop)
                segments.append(call if call is not None else Text(text[start:stop]))
            if end < 0:
                return segments, len(text)
            pos = end

    def _open_calls(self, text: str) -> list[OpenCall]:
        if not text.startswith("{"):
            return []
        opened = open_json_call(text, 0, lambda start: self._json_prefix(text, start), self.constrained)
        return [OpenCall(opened[0], opened[1])] if opened is not None else []


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

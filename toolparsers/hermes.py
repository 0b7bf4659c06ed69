"""Hermes tool calls (Qwen2.5, Qwen3, Hermes, and our SmolLM2 template): JSON inside `<tool_call>` tags.

Format (one block per call, several in a row, text before and after allowed):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Dublin"}}
    </tool_call>

Follows vLLM's `hermes` parser; "parameters" is accepted for "arguments", `</tool_call>` inside JSON
strings does not end a block, and a final block without `</tool_call>` is accepted when its JSON is
complete. Streaming: once a block has written `{"name": "NAME", "arguments": {` (under a grammar,
`constrained`: once `{"name": "NAME"` is written), the call's header goes out and its arguments
stream as the model writes them (toolparsers/base.py).
"""

from __future__ import annotations

from toolparsers.base import OpenCall, Segment, ToolParser
from toolparsers.call_format import NAME_JSON, CallFormat
from toolparsers.scanning import (
    call_from_members,
    cut_decided_call,
    header_call_segments,
    json_block_end,
    json_call_header,
    json_members,
    open_json_call,
    scan_tagged,
    skip_ws,
)

START = "<tool_call>"
END = "</tool_call>"


class HermesParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (vLLM name: hermes)."""

    name = "hermes"
    # The grammar writes `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`, joined by "\n".
    call_format = CallFormat(f'{START}\n{{"name": {NAME_JSON}, "arguments": ', "}\n" + END, START, "\n")

    def _scan(self, text: str, final: bool) -> tuple[list[Segment], int]:
        def find_end(text: str, pos: int) -> int | None:
            return json_block_end(text, pos, END, self._memo)

        def parse_block(inner: str) -> list[Segment] | None:
            return _parse_block(inner, self.constrained)

        return scan_tagged(text, final, START, END, parse_block, find_end)

    def _open_calls(self, text: str) -> list[OpenCall]:
        if not text.startswith(START):
            return []
        opened = open_json_call(text, skip_ws(text, len(START)), lambda start: self._json_prefix(text, start),
                                self.constrained)
        return [OpenCall(opened[0], opened[1])] if opened is not None else []


def _parse_block(inner: str, constrained: bool) -> list[Segment] | None:
    first = skip_ws(inner, 0)
    header = json_call_header(inner, first)
    if header is not None:
        return header_call_segments(inner, first, len(inner), header)
    call = call_from_members(json_members(inner), ("arguments", "parameters"))
    if call is None and constrained:   # an unclosed block cut after its name (its header streamed)
        call = cut_decided_call(inner, first, len(inner))
    return [call] if call is not None else None

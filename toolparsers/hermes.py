"""Hermes tool calls (Qwen2.5, Qwen3, Hermes, and our SmolLM2 template): JSON inside `<tool_call>` tags.

Format (one block per call, several in a row, text before and after allowed):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Dublin"}}
    </tool_call>

Follows vLLM's `hermes` parser; "parameters" is accepted for "arguments", `</tool_call>` inside JSON
strings does not end a block, and a final block without `</tool_call>` is accepted when its JSON is
complete.
"""

from __future__ import annotations

from toolparsers.base import Call, Segment, ToolParser
from toolparsers.call_format import NAME_JSON, CallFormat
from toolparsers.scanning import call_from_members, json_block_end, json_members, scan_tagged

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

        return scan_tagged(text, final, START, END, _parse_block, find_end)


def _parse_block(inner: str) -> list[Call] | None:
    call = call_from_members(json_members(inner), ("arguments", "parameters"))
    return [call] if call is not None else None

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

import json

from constrained.spec import GrammarSpec
from toolparsers.base import Call, Segment, ToolChoice, ToolParser, ToolSpec
from toolparsers.scanning import call_from_members, json_block_end, json_members, scan_tagged
from toolparsers.structural import tagged_call_grammar

START = "<tool_call>"
END = "</tool_call>"


class HermesParser(ToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (vLLM name: hermes)."""

    name = "hermes"

    def _scan(self, text: str, final: bool) -> tuple[list[Segment], int]:
        def find_end(text: str, pos: int) -> int | None:
            return json_block_end(text, pos, END, self._memo)

        return scan_tagged(text, final, START, END, _parse_block, find_end)

    def grammar_for(
        self, tools: list[ToolSpec], tool_choice: ToolChoice, parallel_tool_calls: bool = True
    ) -> GrammarSpec | None:
        """Structural tag: per tool, begin `<tool_call>\\n{"name": "NAME", "arguments": `, the tool's
        parameter schema, end `}\\n</tool_call>`; trigger `<tool_call>`; forced calls joined by "\\n"."""
        return tagged_call_grammar(tools, tool_choice, parallel_tool_calls, _begin_end, START, "\n")


def _begin_end(name: str) -> tuple[str, str]:
    return f'{START}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": ', "}\n" + END


def _parse_block(inner: str) -> list[Call] | None:
    call = call_from_members(json_members(inner), ("arguments", "parameters"))
    return [call] if call is not None else None

"""Tool-call parsers, one module per model family's call format (vLLM's `--tool-call-parser` names).

Each parser declares its `call_format` (begin / end / trigger of one call), parses whole outputs,
streams tool-call deltas (a call's header, then its arguments as they are generated), and renders
the `GrammarSpec` that forces or guides calls in its own format (toolparsers/tool_grammar.py, one
function for every format of JSON between tags). Pure: strings and small dataclasses in and out,
no model.
"""

from __future__ import annotations

import importlib

from toolparsers.base import (
    CallFormat,
    ParseResult,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolParser,
    ToolSpec,
    new_call_id,
)
from toolparsers.json_prefix import JsonObjectPrefix
from toolparsers.errors import (
    InvalidToolChoice,
    ToolParserError,
    UnknownTool,
    UnknownToolParser,
    UnsupportedTool,
)

# Name (as in vLLM's --tool-call-parser) -> "module:Class"; imported on first lookup (STYLE §5).
TOOL_PARSERS: dict[str, str] = {
    "hermes": "toolparsers.hermes:HermesParser",
    "llama3_json": "toolparsers.llama3:Llama3JsonParser",
    "mistral": "toolparsers.mistral:MistralParser",
    "pythonic": "toolparsers.pythonic:PythonicParser",
    "qwen3_coder": "toolparsers.qwen3_coder:Qwen3CoderParser",
}


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class registered as `name`; raises UnknownToolParser listing the known names."""
    target = TOOL_PARSERS.get(name)
    if target is None:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise UnknownToolParser(f"unknown tool call parser {name!r}; known parsers: {known}")
    module_name, class_name = target.split(":")
    parser_class = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(parser_class, type) and issubclass(parser_class, ToolParser)):
        raise TypeError(f"{target} is not a ToolParser subclass")
    return parser_class


__all__ = [
    "TOOL_PARSERS",
    "CallFormat",
    "InvalidToolChoice",
    "JsonObjectPrefix",
    "ParseResult",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoice",
    "ToolParser",
    "ToolParserError",
    "ToolSpec",
    "UnknownTool",
    "UnknownToolParser",
    "UnsupportedTool",
    "get_tool_parser",
    "new_call_id",
]

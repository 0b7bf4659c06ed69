"""The tool grammar of a request: which tools may be called, whether a call is forced, and the
typed structural tags that write each call in a parser's `CallFormat`.

One function, `tool_grammar`, serves every format whose calls are JSON (or Qwen XML parameters)
between literal tags (hermes, llama3_json, qwen3_coder); pythonic and mistral, whose calls are not
one tagged object per tool, override `ToolParser.grammar_for`. Composition (auto / forced, one or
many calls, an answer beside the calls) is constrained/compose.py's.
"""

from __future__ import annotations

from typing import Any

from constrained.compose import tool_calls_grammar
from constrained.structural_tag import StructuralTag, StructuralTagGrammar
from toolparsers.call_format import CallFormat
from toolparsers.errors import InvalidToolChoice, UnknownTool
from toolparsers.tool_spec import ToolChoice, ToolSpec


def resolve_tool_choice(tools: list[ToolSpec], tool_choice: ToolChoice) -> tuple[list[ToolSpec], bool]:
    """The tools a call may use and whether a call is forced, for one request.

    `tool_choice`: "none" / "auto" / "required", or a named function as `{"name": ...}` or the OpenAI
    shape `{"type": "function", "function": {"name": ...}}`. "none" gives no tools.
    Raises InvalidToolChoice for other values or "required" without tools, UnknownTool for a name
    not in `tools`.
    """
    if tool_choice == "none":
        return [], False
    if tool_choice == "auto":
        return list(tools), False
    if tool_choice == "required":
        if not tools:
            raise InvalidToolChoice('tool_choice "required" needs at least one tool', param="tool_choice")
        return list(tools), True
    name = _named_choice(tool_choice)
    for tool in tools:
        if tool.name == name:
            return [tool], True
    known = ", ".join(tool.name for tool in tools) or "none"
    raise UnknownTool(
        f"tool_choice names function {name!r}, which is not in tools (tools: {known})", param="tool_choice"
    )


def _named_choice(tool_choice: Any) -> str:
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else tool_choice.get("name")
        if isinstance(name, str) and name:
            return name
    raise InvalidToolChoice(
        f'tool_choice must be "none", "auto", "required" or a named function, got {tool_choice!r}',
        param="tool_choice",
    )


def single_call(tool_choice: ToolChoice, parallel_tool_calls: bool) -> bool:
    """True when at most one call may be made: a named function, or parallel_tool_calls false."""
    return isinstance(tool_choice, dict) or not parallel_tool_calls


def arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    """The JSON schema a call's arguments must match: the tool's parameters, typed "object" when the
    schema names no type (so the arguments are always an object, never a bare string)."""
    schema = dict(tool.parameters or {})
    if "type" not in schema and not any(key in schema for key in ("anyOf", "oneOf", "allOf", "$ref")):
        schema["type"] = "object"
    if schema.get("type") == "object":
        schema.setdefault("properties", {})
    return schema


def tool_grammar(
    call_format: CallFormat, tools: list[ToolSpec], tool_choice: ToolChoice, parallel_tool_calls: bool
) -> StructuralTagGrammar | None:
    """The calls of `tools` under `tool_choice`, one structural tag per callable tool written in
    `call_format`: `begin_for(name)`, the arguments (`arguments_schema`, in the format's style), `end`.
    JSON arguments take the fixed layout (`StructuralTag.fixed_layout`: `{"key": value, ...}`, no
    free whitespace): after the decided name, the grammar then forces the arguments' `{` and, where
    the schema fixes it, the first key, so jump-forward writes them in the name's step.

    None for "none" and for "auto" without tools. "auto": free text, a call wherever the trigger
    appears; "required": at least one call; named: exactly that tool, once; parallel_tool_calls
    false: one call at most in every mode. Raises what `resolve_tool_choice` raises.
    """
    allowed, forced = resolve_tool_choice(tools, tool_choice)
    if not allowed:
        return None
    end, style = call_format.end, call_format.style
    fixed = style == "json"
    tags = [StructuralTag(call_format.begin_for(tool.name), arguments_schema(tool), end, style, fixed)
            for tool in allowed]
    return tool_calls_grammar(tags, call_format.trigger, call_format.separator, forced=forced,
                              single=single_call(tool_choice, parallel_tool_calls))

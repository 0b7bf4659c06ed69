"""Structural-tag GrammarSpecs for tool calls: resolving `tool_choice` and encoding the tag source.

Source of a `GrammarKind.STRUCTURAL_TAG` spec (JSON text; xgrammar's legacy structural tag, as vLLM
sends it, plus three keys that default to the legacy behaviour):

    {"structures": [{"begin": str, "schema": {JSON schema}, "end": str, "style": "json" | "qwen_xml"}],
     "triggers": [str],
     "forced": bool, "stop_after_first": bool, "separator": str}

- Each structure is one tool call: the literal `begin`, then content matching `schema`, then the
  literal `end`. `style` "json" (the default) writes the content as JSON; "qwen_xml" writes the
  object's members as `<parameter=KEY>VALUE</parameter>` (xgrammar `JSONSchemaFormat.style`).
- `forced` false: free text; wherever a trigger (a prefix of some `begin`) appears, one structure whose
  `begin` starts with it must follow, then free text again (xgrammar `triggered_tags`).
- `forced` true: no free text at all; one or more structures joined by exactly `separator`
  (xgrammar `tags_with_separator` with `at_least_one`).
- `stop_after_first` true: the output ends after the first structure (one call only).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from constrained.spec import GrammarKind, GrammarSpec
from toolparsers.base import ToolChoice, ToolSpec
from toolparsers.errors import InvalidToolChoice, UnknownTool


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


def arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    """The JSON schema a call's arguments must match: the tool's parameters, typed "object" when the
    schema names no type (so the arguments are always an object, never a bare string)."""
    schema = dict(tool.parameters or {})
    if "type" not in schema and not any(key in schema for key in ("anyOf", "oneOf", "allOf", "$ref")):
        schema["type"] = "object"
    if schema.get("type") == "object":
        schema.setdefault("properties", {})
    return schema


def structure(begin: str, schema: dict[str, Any], end: str, style: str = "json") -> dict[str, Any]:
    """One entry of `structures`: literal `begin`, content matching `schema` in `style`, literal `end`."""
    return {"begin": begin, "schema": schema, "end": end, "style": style}


def structural_tag_spec(
    structures: list[dict[str, Any]],
    triggers: list[str],
    forced: bool,
    stop_after_first: bool,
    separator: str,
) -> GrammarSpec:
    """A `GrammarKind.STRUCTURAL_TAG` spec with the source format described in this module's docstring."""
    source = {
        "structures": structures,
        "triggers": triggers,
        "forced": forced,
        "stop_after_first": stop_after_first,
        "separator": separator,
    }
    return GrammarSpec(kind=GrammarKind.STRUCTURAL_TAG, source=json.dumps(source, ensure_ascii=False))


def tagged_call_grammar(
    tools: list[ToolSpec],
    tool_choice: ToolChoice,
    parallel_tool_calls: bool,
    begin_end: Callable[[str], tuple[str, str]],
    trigger: str,
    separator: str,
    style: str = "json",
) -> GrammarSpec | None:
    """The spec for formats with one structure per tool; `begin_end(name) -> (begin, end)`.

    None for "none" and for "auto" without tools. A named choice allows exactly one call;
    `parallel_tool_calls` False allows at most one call in every mode.
    """
    allowed, forced = resolve_tool_choice(tools, tool_choice)
    if not allowed:
        return None
    structures = []
    for tool in allowed:
        begin, end = begin_end(tool.name)
        structures.append(structure(begin, arguments_schema(tool), end, style))
    named = isinstance(tool_choice, dict)
    return structural_tag_spec(
        structures, [trigger], forced, stop_after_first=named or not parallel_tool_calls, separator=separator
    )

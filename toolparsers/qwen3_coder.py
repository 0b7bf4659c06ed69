"""Qwen3-Coder tool calls: XML parameters inside `<tool_call><function=NAME>` blocks.

Format (vLLM `qwen3_coder`; one function per block):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Dublin
    </parameter>
    </function>
    </tool_call>

A value loses one leading and one trailing newline. With `tools` given to the constructor, values are
converted by the parameter's schema type (integer, number, boolean, null, object/array as JSON or
Python literal); strings, unknown parameters and failed conversions stay strings. The arguments are
`json.dumps(values, ensure_ascii=False)`.

Streaming (toolparsers/base.py): a call's header goes out once `<function=NAME>` and its first
`<parameter=` are written; its arguments stream as the JSON built one parameter at a time (`{`,
then `"key": value` as each `</parameter>` arrives, then `}` at `</function>`). A block that turns
out malformed after its header keeps the JSON of the parameters read so far followed by the rest of
the block verbatim (not valid JSON).
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from toolparsers.base import Call, OpenCall, Segment, Text, ToolParser
from toolparsers.call_format import NAME, CallFormat
from toolparsers.scanning import scan_tagged

START = "<tool_call>"
END = "</tool_call>"
PARAM_START = "<parameter="
PARAM_END = "</parameter>"
_FUNCTION_OPEN = re.compile(r"\s*<function=([^>\n]+)>")
_FUNCTION_CLOSE = re.compile(r"\s*</function>\s*")
_PARAMETER_OPEN = re.compile(r"\s*<parameter=")
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


class Qwen3CoderParser(ToolParser):
    """`<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>` (qwen3_coder)."""

    name = "qwen3_coder"
    # The grammar writes `<tool_call>\n<function=NAME>\n` + the arguments as `<parameter=KEY>VALUE
    # </parameter>` members (style "qwen_xml", xgrammar only) + `\n</function>\n</tool_call>`.
    call_format = CallFormat(f"{START}\n<function={NAME}>\n", f"\n</function>\n{END}", START,
                             separator="\n", style="qwen_xml")

    def _scan(self, text: str, final: bool) -> tuple[list[Segment], int]:
        return scan_tagged(text, final, START, END, self._parse_block, _find_end)

    def _parse_block(self, inner: str) -> list[Segment] | None:
        opened = _FUNCTION_OPEN.match(inner)
        if opened is None or not opened.group(1).strip():
            return None
        name = opened.group(1).strip()
        members, pos = self._members(inner, opened.end(), name)
        closed = _FUNCTION_CLOSE.match(inner, pos)
        # what follows </function> in a block the output ended in may be the start of </tool_call>
        rest = inner[closed.end():] if closed is not None else ""
        if closed is not None and (not rest or END.startswith(rest)):
            return [Call(name, "{" + ", ".join(members) + "}")]
        if _PARAMETER_OPEN.match(inner, opened.end()) is None:
            return None   # no header went out: the block is content
        if closed is not None:
            return [Call(name, "{" + ", ".join(members) + "}"), Text(rest)]
        return [Call(name, "{" + ", ".join(members) + inner[pos:], complete=False)]

    def _open_calls(self, text: str) -> list[OpenCall]:
        if not text.startswith(START):
            return []
        opened = _FUNCTION_OPEN.match(text, len(START))
        if opened is None or not opened.group(1).strip() or _PARAMETER_OPEN.match(text, opened.end()) is None:
            return []
        name = opened.group(1).strip()
        members, _ = self._members(text, opened.end(), name)
        return [OpenCall(name, "{" + ", ".join(members))]   # "}" only once the block is decided

    def _members(self, text: str, pos: int, name: str) -> tuple[list[str], int]:
        """The JSON members (`"key": value`) of the complete parameters from `pos` on, in order, and
        the index past the last one; stops at anything else (or a value JSON cannot hold)."""
        properties = self._properties(name)
        members: list[str] = []
        while (param := _PARAMETER.match(text, pos)) is not None:
            key = param.group(1).strip()
            value = _convert(_strip_newline(param.group(2)), properties.get(key))
            try:
                members.append(json.dumps(key, ensure_ascii=False) + ": "
                               + json.dumps(value, ensure_ascii=False, allow_nan=False))
            except ValueError:
                break
            pos = param.end()
        return members, pos

    def _properties(self, name: str) -> dict[str, Any]:
        for tool in self.tools:
            if tool.name == name:
                properties = (tool.parameters or {}).get("properties")
                return properties if isinstance(properties, dict) else {}
        return {}


def _find_end(text: str, pos: int) -> int:
    """Index of the `</tool_call>` closing the block whose inner text starts at `pos`, skipping
    parameter values (which may contain it); -1 if none yet."""
    while True:
        param = text.find(PARAM_START, pos)
        close = text.find(END, pos)
        if close >= 0 and (param < 0 or close < param):
            return close
        if param < 0:
            return -1
        value_end = text.find(PARAM_END, param)
        if value_end < 0:
            return -1
        pos = value_end + len(PARAM_END)


def _strip_newline(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _convert(value: str, schema: Any) -> Any:
    """`value` converted to the first type of `schema` it fits; the string itself when none does."""
    if not isinstance(schema, dict):
        return value
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    for kind in types:
        converted = _convert_one(value, kind)
        if converted is not _FAILED:
            return converted
    return value


_FAILED = object()


def _convert_one(value: str, kind: Any) -> Any:
    text = value.strip()
    if kind == "null":
        return None if text.lower() in ("null", "none") else _FAILED
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.lower(), _FAILED)
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            return _FAILED
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            return _FAILED
        return int(number) if number.is_integer() and re.fullmatch(r"-?\d+", text) else number
    if kind in ("object", "array"):
        for loader in (json.loads, ast.literal_eval):
            try:
                loaded = loader(text)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if isinstance(loaded, dict if kind == "object" else (list, tuple)):
                return list(loaded) if isinstance(loaded, tuple) else loaded
        return _FAILED
    return value if kind == "string" else _FAILED

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
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from toolparsers.base import Call, Segment, ToolParser
from toolparsers.call_format import NAME, CallFormat
from toolparsers.scanning import scan_tagged

START = "<tool_call>"
END = "</tool_call>"
PARAM_START = "<parameter="
PARAM_END = "</parameter>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
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

    def _parse_block(self, inner: str) -> list[Call] | None:
        match = _FUNCTION.fullmatch(inner)
        if match is None or not match.group(1).strip():
            return None
        name, body = match.group(1).strip(), match.group(2)
        properties = self._properties(name)
        values: dict[str, Any] = {}
        pos = 0
        for param in _PARAMETER.finditer(body):
            if param.start() != pos:
                return None
            key = param.group(1).strip()
            values[key] = _convert(_strip_newline(param.group(2)), properties.get(key))
            pos = param.end()
        if body[pos:].strip():
            return None
        try:
            return [Call(name, json.dumps(values, ensure_ascii=False, allow_nan=False))]
        except ValueError:
            return None

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

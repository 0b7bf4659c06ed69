"""xgrammar EBNF for pythonic call lists: `[get_weather(city="Dublin"), ...]` constrained by the tools.

Keyword arguments follow each tool's schema `properties` in declared order; required ones must be
present, optional ones may be left out. Values by JSON-schema type: string -> double-quoted Python
string, integer, number, boolean -> True/False, null -> None, array -> list of the item type,
`enum`/`const` -> those literals, `anyOf`/`oneOf`/type lists -> alternatives, anything else -> any
Python literal. Properties whose names are not identifiers cannot be keyword arguments and are left out.
"""

from __future__ import annotations

import json
from typing import Any

from constrained.spec import GrammarKind, GrammarSpec
from toolparsers.tool_grammar import arguments_schema
from toolparsers.tool_spec import ToolSpec

_BASE_RULES = r"""py_value ::= py_string | py_number | py_bool | py_none | py_list | py_dict
py_string ::= "\"" py_char* "\""
py_char ::= [^"\\\r\n] | "\\" (["\\/bfnrt'] | "u" hex hex hex hex)
hex ::= [0-9a-fA-F]
py_int ::= "-"? ("0" | [1-9] [0-9]*)
py_number ::= py_int ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
py_bool ::= "True" | "False"
py_none ::= "None"
py_list ::= "[" (py_value (", " py_value)*)? "]"
py_dict ::= "{" (py_string ": " py_value (", " py_string ": " py_value)*)? "}"
any_char ::= [^]
"""

_TYPE_RULES = {
    "string": "py_string",
    "integer": "py_int",
    "number": "py_number",
    "boolean": "py_bool",
    "null": "py_none",
    "object": "py_dict",
    "array": "py_list",
}


def pythonic_grammar(tools: list[ToolSpec], forced: bool, single: bool) -> GrammarSpec:
    """The EBNF spec (`GrammarKind.GRAMMAR`, backend "xgrammar") for a call list over `tools`.

    `forced`: the whole output is the list; otherwise the output may instead be any text that does
    not start with "[". `single`: the list holds exactly one call.
    """
    builder = _Builder()
    calls = [builder.call(tool) for tool in tools]
    call_rule = builder.add(" | ".join(calls), "call")
    calls_body = call_rule if single else f'{call_rule} (", " {call_rule})*'
    call_list = f'"[" {calls_body} "]"'
    root = call_list if forced else f'"" | {call_list} | [^[] any_char*'
    source = f"root ::= {root}\n" + "\n".join(builder.rules) + "\n" + _BASE_RULES
    return GrammarSpec(kind=GrammarKind.GRAMMAR, source=source, backend="xgrammar")


def _literal(text: str) -> str:
    """`text` as an EBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


def _py_literal(value: Any) -> str | None:
    """The Python source of a JSON value, or None when it has none (NaN, infinities)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if text not in ("nan", "inf", "-inf") else None
    if isinstance(value, list):
        items = [_py_literal(item) for item in value]
        return None if None in items else "[" + ", ".join(items) + "]"  # type: ignore[arg-type]
    if isinstance(value, dict):
        pairs = [(_py_literal(str(key)), _py_literal(item)) for key, item in value.items()]
        if any(part is None for pair in pairs for part in pair):
            return None
        return "{" + ", ".join(f"{key}: {item}" for key, item in pairs) + "}"
    return None


class _Builder:
    """Collects generated rules; names are numbered per builder (no shared state)."""

    def __init__(self) -> None:
        self.rules: list[str] = []

    def add(self, body: str, hint: str) -> str:
        """Add rule `body` under a fresh name built from `hint`; returns the name."""
        name = f"{hint}_{len(self.rules)}"
        self.rules.append(f"{name} ::= {body}")
        return name

    def call(self, tool: ToolSpec) -> str:
        """The rule for one call `name(kw=value, ...)` of `tool`; returns its name."""
        schema = arguments_schema(tool)
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = set(schema.get("required") or [])
        items = [
            (f"{_literal(key + '=')} {self.value(sub)}", key in required)
            for key, sub in properties.items()
            if key.isidentifier()
        ]
        first, rest = '""', '""'
        # first_k: arguments k.. when none was written yet; rest_k: the same after one (", " first).
        for index in range(len(items) - 1, -1, -1):
            item, is_required = items[index]
            new_first = f"{item} {rest}" + ("" if is_required else f" | {first}")
            if index > 0:
                rest = self.add(f'", " {item} {rest}' + ("" if is_required else f" | {rest}"), "more")
            first = self.add(new_first, "args")
        return self.add(f"{_literal(tool.name + '(')} {first} \")\"", "call")

    def value(self, schema: Any) -> str:
        """A rule (or inline EBNF) for Python literals matching `schema`."""
        if not isinstance(schema, dict):
            return "py_value"
        if "const" in schema or isinstance(schema.get("enum"), list):
            values = [schema["const"]] if "const" in schema else schema["enum"]
            literals = [lit for lit in (_py_literal(value) for value in values) if lit is not None]
            return "(" + " | ".join(_literal(lit) for lit in literals) + ")" if literals else "py_value"
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list) and schema[key]:
                return "(" + " | ".join(self.value(sub) for sub in schema[key]) + ")"
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return "(" + " | ".join(self.value({**schema, "type": one}) for one in kind) + ")"
        if kind == "array" and isinstance(schema.get("items"), dict):
            item = self.value(schema["items"])
            return self.add(f'"[" ({item} (", " {item})*)? "]"', "list")
        return _TYPE_RULES.get(kind, "py_value") if isinstance(kind, str) else "py_value"

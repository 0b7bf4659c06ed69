"""The characters a JSON document matching a schema may start with (an over-approximation).

Used where a grammar library must tell a JSON value from literal text by its first character:
llguidance drops a `%json` alternative once a literal lexeme beside it matches the same text, so
guidance refuses an answer-or-calls grammar whose call `begin` starts like the answer.
"""

from __future__ import annotations

import json
from typing import Any

WHITESPACE = " \t\n\r"
_BY_TYPE = {
    "object": "{",
    "array": "[",
    "string": '"',
    "number": "-0123456789",
    "integer": "-0123456789",
    "boolean": "tf",
    "null": "n",
}
ANY_START = "".join(_BY_TYPE.values()) + WHITESPACE


def json_start_chars(schema: Any) -> str:
    """Characters a document matching `schema` may begin with: leading whitespace always; by
    `const` / `enum` values, by `anyOf` / `oneOf` branches, else by `type`; every JSON start for a
    schema that names none of them (true, {}, `$ref`, ...)."""
    if not isinstance(schema, dict):
        return ANY_START if schema is not False else WHITESPACE
    if "const" in schema or isinstance(schema.get("enum"), list):
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return WHITESPACE + "".join(json.dumps(value)[0] for value in values)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return WHITESPACE + "".join(json_start_chars(branch) for branch in branches)
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if not all(isinstance(kind, str) and kind in _BY_TYPE for kind in kinds):
        return ANY_START
    return WHITESPACE + "".join(_BY_TYPE[kind] for kind in kinds)

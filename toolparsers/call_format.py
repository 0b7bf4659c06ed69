"""CallFormat: how a tool-call format writes one call, the begin/end/trigger of SGLang's StructureInfo."""

from __future__ import annotations

import json
from dataclasses import dataclass

NAME = "{name}"
"""In `CallFormat.begin`: the tool's name as it is."""
NAME_JSON = "{name_json}"
"""In `CallFormat.begin`: the tool's name as a JSON string (quoted, escaped)."""


@dataclass(frozen=True, slots=True)
class CallFormat:
    """One call of a format: literal `begin` (naming the tool), the arguments, literal `end`.

    `begin` holds NAME or NAME_JSON where the tool's name goes. `trigger`: the text every `begin`
    starts with, which announces a call inside free text (tool_choice "auto"). `separator`: the
    exact text between two calls in a row. `style`: how the arguments are written, "json" (a JSON
    object) or "qwen_xml" (`<parameter=KEY>VALUE</parameter>` members). Raises ValueError when
    `begin` does not start with `trigger`.
    """

    begin: str
    end: str
    trigger: str
    separator: str = "\n"
    style: str = "json"

    def __post_init__(self) -> None:
        if not self.trigger or not self.begin.startswith(self.trigger):
            raise ValueError(f"call begin {self.begin!r} must start with its trigger {self.trigger!r}")

    def begin_for(self, name: str) -> str:
        """`begin` for the tool called `name`."""
        return self.begin.replace(NAME_JSON, json.dumps(name, ensure_ascii=False)).replace(NAME, name)

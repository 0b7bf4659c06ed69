"""ToolSpec and ToolChoice: a request's function tools and tool_choice, as the parsers see them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ToolChoice = Literal["none", "auto", "required"] | dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One function tool of a request (OpenAI `tools[].function`).

    `parameters` is the JSON schema of the arguments object; `strict` is the client's `strict` flag
    (the grammar constrains calls to the schema whether or not it is set). A tool without
    parameters takes none (OpenAI: "omitting parameters defines a function with an empty
    parameter list"), so the default schema admits only `{}`.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}, "additionalProperties": False})
    strict: bool = False

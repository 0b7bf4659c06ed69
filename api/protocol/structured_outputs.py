"""vLLM's `structured_outputs` request object (chat and completions), field names verbatim.

At most one constraint (json, regex, choice, grammar, json_object, structural_tag); the options
(disable_any_whitespace, disable_additional_properties, backend) also apply to a constraint that
comes from `response_format` or from tools. Unknown keys are a 400, as in vLLM.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from api.protocol.common import NestedModel

CONSTRAINT_FIELDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class StructuredOutputs(NestedModel):
    """`structured_outputs`: one output constraint plus whitespace / closed-object / backend options.

    `json` is a JSON schema (object, or its JSON text); `choice` a non-empty list of strings;
    `structural_tag` an object (or its JSON text) with `structures` and `triggers`;
    `json_object: true` asks for any JSON object. `backend` is "auto", "xgrammar" or "guidance".
    """

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = Field(default=None, min_length=1)
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = Field(default=None, min_length=1)
    json_object: bool | None = None
    structural_tag: dict[str, Any] | str | None = None
    disable_any_whitespace: bool | None = False
    disable_additional_properties: bool | None = False
    backend: str | None = None

    @model_validator(mode="after")
    def _at_most_one_constraint(self) -> StructuredOutputs:
        given = self.constraint_names()
        if len(given) > 1:
            raise PydanticCustomError(
                "conflict",
                "structured_outputs takes one constraint, got {names}",
                {"names": ", ".join(given)},
            )
        return self

    def constraint_names(self) -> list[str]:
        """Names of the constraint fields that are set (`json_object: false` counts as unset)."""
        values = {
            "json": self.json_,
            "regex": self.regex,
            "choice": self.choice,
            "grammar": self.grammar,
            "json_object": self.json_object or None,
            "structural_tag": self.structural_tag,
        }
        return [name for name in CONSTRAINT_FIELDS if values[name] is not None]

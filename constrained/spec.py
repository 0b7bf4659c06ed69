"""GrammarSpec: what a request's output must match, before any backend compiles it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class GrammarKind(str, Enum):
    """The kinds of constraint a request can carry (vLLM `structured_outputs` names)."""

    JSON_SCHEMA = "json_schema"      # source: the schema as canonical JSON text
    JSON_OBJECT = "json_object"      # source: "" (any JSON object)
    REGEX = "regex"                  # source: the pattern
    CHOICE = "choice"                # source: JSON list of strings
    GRAMMAR = "grammar"              # source: EBNF (xgrammar dialect) or Lark (llguidance)
    STRUCTURAL_TAG = "structural_tag"  # source: JSON {"triggers": [...], "structures": [...]}


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """One constraint: `kind` + `source` text, optional backend ("xgrammar", "guidance") and options.

    `any_whitespace` False forbids free whitespace in JSON (vLLM disable_any_whitespace);
    `additional_properties` False treats objects without `additionalProperties` as closed.
    Hashable: it is the compile-cache key together with the backend name.
    """

    kind: GrammarKind
    source: str
    backend: str | None = None
    any_whitespace: bool = True
    additional_properties: bool = True

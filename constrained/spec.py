"""GrammarSpec: what a request's output must match, before any backend compiles it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


# Longest whitespace run allowed between JSON tokens when any_whitespace is on: enough for
# pretty-printed JSON (newline + indent), short enough that a sampled model cannot loop on
# whitespace until max_tokens (llama.cpp and vLLM reports show exactly that failure). 16 is the
# bound shared/cases/012 sets for any output; 20 let SmolLM2 write a 20-character run there.
MAX_JSON_WHITESPACE = 16

FIXED_LAYOUT_SEPARATORS = (", ", ": ")
"""(item, key) separators of JSON written in the fixed layout (no free whitespace, one space after
each separator: Python's json.dumps default, and xgrammar's default when any_whitespace is off).
Tool calls use it (`StructuralTag.fixed_layout`): with no whitespace
left to choose, the grammar forces `{"key": ` after a decided name, and jump-forward writes it."""


def guidance_json_options(any_whitespace: bool, fixed_layout: bool = False) -> dict[str, object]:
    """llguidance's JSON options (`x-guidance`): with `fixed_layout`, no free whitespace and the
    FIXED_LAYOUT_SEPARATORS; else for `any_whitespace` runs of 1..MAX_JSON_WHITESPACE whitespace
    characters between tokens, or none (compact JSON, separators "," and ":"). Format:
    llguidance's JsonCompileOptions (whitespace_flexible, whitespace_pattern, item_separator,
    key_separator)."""
    if fixed_layout:
        item, key = FIXED_LAYOUT_SEPARATORS
        return {"whitespace_flexible": False, "item_separator": item, "key_separator": key}
    if not any_whitespace:
        return {"whitespace_flexible": False}
    return {"whitespace_flexible": True, "whitespace_pattern": f"[\\x20\\x0A\\x0D\\x09]{{1,{MAX_JSON_WHITESPACE}}}"}


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

    `any_whitespace` False forbids free whitespace in JSON (vLLM disable_any_whitespace); True
    allows runs of at most MAX_JSON_WHITESPACE characters between tokens;
    `additional_properties` False treats objects without `additionalProperties` as closed.
    Hashable: it is the compile-cache key together with the backend name.
    """

    kind: GrammarKind
    source: str
    backend: str | None = None
    any_whitespace: bool = True
    additional_properties: bool = True

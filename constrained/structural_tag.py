"""Structural tags: constrained `begin content end` segments (tool calls), with or without free text.

Source format, as JSON text in `GrammarSpec.source` (xgrammar's legacy structural tag as vLLM sends
it, plus keys that default to the legacy behaviour; `StructuralTagGrammar.spec` writes it, and
`parse_structural_tag` reads it back into the same dataclasses):

    {"structures": [{"begin": str, "schema": <JSON schema>, "end": str, "style": "json" | "qwen_xml",
                     "fixed_layout": bool}],                  ("fixed_layout" only when true)
     "triggers": [str], "forced": bool, "stop_after_first": bool, "separator": str,
     "answer": <JSON schema>}                                    ("answer" only when set)

- `style` "json" (default): the content is JSON matching `schema`; "qwen_xml": the object's members
  as `<parameter=KEY>VALUE</parameter>` (xgrammar `JSONSchemaFormat(style="qwen_xml")`).
- `fixed_layout` true (style "json" only): the content is written without free whitespace, with
  the separators `, ` and `: ` (constrained.spec.FIXED_LAYOUT_SEPARATORS), whatever the spec's
  `any_whitespace`; the content then starts right after `begin` with no whitespace either. Tool
  calls use it: every character after a decided name up to the first free value is forced.
- `forced` false (default): free text; wherever a trigger appears, a structure whose `begin` starts
  with it must follow, then free text again. EOS is allowed anywhere outside a structure. Every
  `begin` must start with a trigger.
- `forced` true: no free text; one or more structures joined by exactly `separator` (default "");
  EOS only right after a complete structure. `triggers` may then be empty.
- `stop_after_first` true: nothing may follow the first structure.
- `answer` (needs `forced`): the output is either one JSON document matching this schema or the
  forced structures, nothing else (constrained/compose.py builds it for tools + a JSON format).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from constrained.errors import InvalidGrammar
from constrained.schema_walk import check_schema_shape
from constrained.source import parse_json, prepare_schema
from constrained.spec import GrammarKind, GrammarSpec

_PARAM = GrammarKind.STRUCTURAL_TAG.value
STYLES = ("json", "qwen_xml")
ANSWER_POINTER = "#/answer"
"""The JSON pointer of the answer schema in the source, used in error messages."""


@dataclass(frozen=True, slots=True, eq=False)
class StructuralTag:
    """One constrained segment: literal `begin`, content matching `schema` written in `style`
    ("json" or "qwen_xml"), literal `end`. `fixed_layout`: JSON content without free whitespace,
    separators `, ` and `: ` (style "json" only; see the module docstring)."""

    begin: str
    schema: dict[str, Any] | bool
    end: str
    style: str = "json"
    fixed_layout: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class StructuralTagGrammar:
    """A structural tag as typed data (see the module docstring for the meaning of each field)."""

    tags: tuple[StructuralTag, ...]
    triggers: tuple[str, ...]
    forced: bool = False
    stop_after_first: bool = False
    separator: str = ""
    answer: dict[str, Any] | bool | None = None

    def trigger_of(self, tag: StructuralTag) -> str:
        """The longest trigger that `tag.begin` starts with; "" when none does (forced tags only)."""
        return max((t for t in self.triggers if tag.begin.startswith(t)), key=len, default="")

    def spec(self, backend: str | None = None, any_whitespace: bool = True,
             additional_properties: bool = True) -> GrammarSpec:
        """The structural_tag GrammarSpec of this grammar (source as compact JSON, the module's format).

        Not validated here (walking every schema is ~90% of building a tool grammar, per request):
        compiling checks it (parse_structural_tag, InvalidGrammar), once per distinct spec.
        """
        structures = [_structure(t) for t in self.tags]
        data: dict[str, Any] = {
            "structures": structures,
            "triggers": list(self.triggers),
            "forced": self.forced,
            "stop_after_first": self.stop_after_first,
            "separator": self.separator,
        }
        if self.answer is not None:
            data["answer"] = self.answer
        source = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        return GrammarSpec(GrammarKind.STRUCTURAL_TAG, source, backend, any_whitespace, additional_properties)


def _structure(tag: StructuralTag) -> dict[str, Any]:
    """One `structures` item of the source format."""
    item: dict[str, Any] = {"begin": tag.begin, "schema": tag.schema, "end": tag.end, "style": tag.style}
    if tag.fixed_layout:
        item["fixed_layout"] = True
    return item


def structural_tag_spec(
    tags: Sequence[StructuralTag],
    triggers: Sequence[str],
    *,
    forced: bool = False,
    stop_after_first: bool = False,
    separator: str = "",
    backend: str | None = None,
    any_whitespace: bool = True,
    additional_properties: bool = True,
) -> GrammarSpec:
    """Build the structural_tag GrammarSpec for `tags` and `triggers` (`StructuralTagGrammar.spec`).

    Raises InvalidGrammar when the result would not parse (see parse_structural_tag).
    """
    grammar = StructuralTagGrammar(tuple(tags), tuple(triggers), forced, stop_after_first, separator)
    spec = grammar.spec(backend, any_whitespace, additional_properties)
    parse_structural_tag(spec)
    return spec


def parse_structural_tag(spec: GrammarSpec) -> StructuralTagGrammar:
    """Parse and validate a structural_tag spec; schemas are closed when `additional_properties` is False.

    Raises InvalidGrammar (param="structural_tag") on invalid JSON, missing or mistyped fields, an
    unknown style, a `fixed_layout` that is not a boolean or not on style "json", an empty
    trigger, no trigger without `forced`, a `begin` that starts with no trigger, an `answer`
    without `forced`, or a malformed schema (check_schema_shape).
    """
    data = parse_json(spec)
    if not isinstance(data, dict):
        raise InvalidGrammar("structural_tag source must be a JSON object", param=_PARAM)
    structures, triggers = data.get("structures"), data.get("triggers", [])
    forced, stop_after_first = data.get("forced", False), data.get("stop_after_first", False)
    separator = data.get("separator", "")
    if not isinstance(forced, bool) or not isinstance(stop_after_first, bool) or not isinstance(separator, str):
        raise InvalidGrammar("structural_tag 'forced' and 'stop_after_first' must be booleans, "
                             "'separator' a string", param=_PARAM)
    if not isinstance(triggers, list) or not (triggers or forced):
        raise InvalidGrammar("structural_tag needs a non-empty 'triggers' list", param=_PARAM)
    if not all(isinstance(t, str) and t for t in triggers):
        raise InvalidGrammar("structural_tag triggers must be non-empty strings", param=_PARAM)
    if not isinstance(structures, list) or not structures:
        raise InvalidGrammar("structural_tag needs a non-empty 'structures' list", param=_PARAM)
    tags = [_parse_structure(i, item, triggers, spec) for i, item in enumerate(structures)]
    answer = data.get("answer")
    if answer is not None:
        if not forced:
            raise InvalidGrammar("structural_tag 'answer' needs 'forced': free text cannot stand beside "
                                 "a JSON answer", param=_PARAM)
        answer = prepare_schema(answer, spec.additional_properties, _PARAM)
        check_schema_shape(answer, _PARAM, ANSWER_POINTER)
    return StructuralTagGrammar(tuple(tags), tuple(triggers), forced, stop_after_first, separator, answer)


def _parse_structure(i: int, item: Any, triggers: list[str], spec: GrammarSpec) -> StructuralTag:
    if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("begin", "end")):
        raise InvalidGrammar(f"structures[{i}] needs string 'begin' and 'end'", param=_PARAM)
    if "schema" not in item:
        raise InvalidGrammar(f"structures[{i}] needs a 'schema'", param=_PARAM)
    style = item.get("style", "json")
    if style not in STYLES:
        raise InvalidGrammar(f"structures[{i}].style {style!r} is not one of {', '.join(STYLES)}", param=_PARAM)
    if triggers and not any(item["begin"].startswith(t) for t in triggers):
        raise InvalidGrammar(f"structures[{i}].begin {item['begin']!r} starts with no trigger", param=_PARAM)
    fixed_layout = item.get("fixed_layout", False)
    if not isinstance(fixed_layout, bool) or (fixed_layout and style != "json"):
        raise InvalidGrammar(f"structures[{i}].fixed_layout must be a boolean, true only with style \"json\"",
                             param=_PARAM)
    schema = prepare_schema(item["schema"], spec.additional_properties, _PARAM)
    check_schema_shape(schema, _PARAM, schema_pointer(i))
    return StructuralTag(item["begin"], schema, item["end"], style, fixed_layout)


def schema_pointer(index: int) -> str:
    """The JSON pointer of structure `index`'s schema in the source, used in error messages."""
    return f"#/structures/{index}/schema"

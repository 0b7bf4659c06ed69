"""Structural tags: free text in which each trigger starts a constrained `begin schema end` segment.

Source format (vLLM / xgrammar legacy structural tag), as JSON text in `GrammarSpec.source`:
`{"structures": [{"begin": str, "schema": <JSON schema>, "end": str}, ...], "triggers": [str, ...]}`.
Every `begin` must start with one of the `triggers`. Tool-call formats use it: the trigger is the
format's call marker (e.g. "<tool_call>") and each tool gives one structure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from constrained.errors import InvalidGrammar
from constrained.source import parse_json, prepare_schema
from constrained.spec import GrammarKind, GrammarSpec

_PARAM = GrammarKind.STRUCTURAL_TAG.value


@dataclass(frozen=True, slots=True, eq=False)
class StructuralTag:
    """One constrained segment: literal `begin`, a JSON value matching `schema`, literal `end`."""

    begin: str
    schema: dict[str, Any] | bool
    end: str


@dataclass(frozen=True, slots=True, eq=False)
class StructuralTagGrammar:
    """A parsed structural_tag source: the tags and their triggers (each tag has exactly one trigger)."""

    tags: tuple[StructuralTag, ...]
    triggers: tuple[str, ...]

    def trigger_of(self, tag: StructuralTag) -> str:
        """The longest trigger that `tag.begin` starts with (parse_structural_tag guarantees one)."""
        return max((t for t in self.triggers if tag.begin.startswith(t)), key=len)


def structural_tag_spec(
    tags: Sequence[StructuralTag],
    triggers: Sequence[str],
    *,
    backend: str | None = None,
    any_whitespace: bool = True,
    additional_properties: bool = True,
) -> GrammarSpec:
    """Build the structural_tag GrammarSpec for `tags` and `triggers` (source as compact JSON).

    Raises InvalidGrammar when the result would not parse (see parse_structural_tag).
    """
    source = json.dumps(
        {
            "structures": [{"begin": t.begin, "schema": t.schema, "end": t.end} for t in tags],
            "triggers": list(triggers),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    spec = GrammarSpec(GrammarKind.STRUCTURAL_TAG, source, backend, any_whitespace, additional_properties)
    parse_structural_tag(spec)
    return spec


def parse_structural_tag(spec: GrammarSpec) -> StructuralTagGrammar:
    """Parse and validate a structural_tag spec; schemas are closed when `additional_properties` is False.

    Raises InvalidGrammar (param="structural_tag") on invalid JSON, missing or mistyped fields, an
    empty trigger, or a `begin` that starts with no trigger.
    """
    data = parse_json(spec)
    if not isinstance(data, dict):
        raise InvalidGrammar("structural_tag source must be a JSON object", param=_PARAM)
    structures, triggers = data.get("structures"), data.get("triggers")
    if not isinstance(triggers, list) or not triggers:
        raise InvalidGrammar("structural_tag needs a non-empty 'triggers' list", param=_PARAM)
    if not all(isinstance(t, str) and t for t in triggers):
        raise InvalidGrammar("structural_tag triggers must be non-empty strings", param=_PARAM)
    if not isinstance(structures, list) or not structures:
        raise InvalidGrammar("structural_tag needs a non-empty 'structures' list", param=_PARAM)
    tags = []
    for i, item in enumerate(structures):
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("begin", "end")):
            raise InvalidGrammar(f"structures[{i}] needs string 'begin' and 'end'", param=_PARAM)
        if "schema" not in item:
            raise InvalidGrammar(f"structures[{i}] needs a 'schema'", param=_PARAM)
        if not any(item["begin"].startswith(t) for t in triggers):
            raise InvalidGrammar(f"structures[{i}].begin {item['begin']!r} starts with no trigger", param=_PARAM)
        schema = prepare_schema(item["schema"], spec.additional_properties, _PARAM)
        tags.append(StructuralTag(item["begin"], schema, item["end"]))
    return StructuralTagGrammar(tuple(tags), tuple(triggers))

"""Parse and canonicalise `GrammarSpec.source` text; shared by both backends and the compile cache."""

from __future__ import annotations

import copy
import json
from typing import Any

from constrained.errors import InvalidGrammar
from constrained.schema_walk import SUBSCHEMA_LIST, SUBSCHEMA_MAP, SUBSCHEMA_ONE
from constrained.spec import GrammarKind, GrammarSpec

_JSON_KINDS = (GrammarKind.JSON_SCHEMA, GrammarKind.CHOICE, GrammarKind.STRUCTURAL_TAG)
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


def parse_json(spec: GrammarSpec) -> Any:
    """Decode the JSON text of a json_schema / choice / structural_tag spec.

    Raises InvalidGrammar (param = the kind) when the text is not valid JSON.
    """
    try:
        return json.loads(spec.source)
    except (json.JSONDecodeError, TypeError) as exc:
        raise InvalidGrammar(f"{spec.kind.value} source is not valid JSON: {exc}", param=spec.kind.value) from exc


def canonical_source(spec: GrammarSpec) -> str:
    """The cache-key form of `spec.source`: compact JSON for JSON kinds (key order kept), "" for
    json_object, the text unchanged otherwise. Raises InvalidGrammar on invalid JSON."""
    if spec.kind == GrammarKind.JSON_OBJECT:
        return ""
    if spec.kind in _JSON_KINDS:
        return json.dumps(parse_json(spec), separators=(",", ":"), ensure_ascii=False)
    return spec.source


def load_schema(spec: GrammarSpec) -> dict[str, Any] | bool:
    """The JSON schema of a json_schema / json_object spec, closed when `additional_properties` is False.

    Returns a fresh dict (or a boolean schema). Raises InvalidGrammar when the source is not
    JSON or not an object / boolean.
    """
    if spec.kind == GrammarKind.JSON_OBJECT:
        return dict(JSON_OBJECT_SCHEMA)
    schema = parse_json(spec)
    return prepare_schema(schema, spec.additional_properties, spec.kind.value)


def prepare_schema(schema: Any, additional_properties: bool, param: str) -> dict[str, Any] | bool:
    """Check that `schema` is a JSON schema (object or boolean) and close objects if asked.

    Raises InvalidGrammar (param=`param`) for any other JSON value.
    """
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise InvalidGrammar(f"a JSON schema must be an object or a boolean, got {type(schema).__name__}",
                             param=param)
    return schema if additional_properties else close_objects(schema)


def close_objects(schema: dict[str, Any]) -> dict[str, Any]:
    """Deep copy of `schema` where every `"type": "object"` subschema without `additionalProperties`
    gets `"additionalProperties": false` (vLLM's disable_additional_properties rule).

    Walks only subschema keywords, so `enum`, `const`, `default` values and property names stay intact.
    """
    out = copy.deepcopy(schema)
    _close(out)
    return out


def _close(node: Any) -> None:
    if not isinstance(node, dict):
        return
    if node.get("type") == "object" and "additionalProperties" not in node:
        node["additionalProperties"] = False
    for key in SUBSCHEMA_ONE:
        _close(node.get(key))
    for key in SUBSCHEMA_MAP:
        sub = node.get(key)
        if isinstance(sub, dict):
            for value in sub.values():
                _close(value)
    for key in SUBSCHEMA_LIST:
        sub = node.get(key)
        if isinstance(sub, list):
            for value in sub:
                _close(value)


def load_choices(spec: GrammarSpec) -> list[str]:
    """The alternatives of a choice spec: a non-empty JSON list of strings.

    Raises InvalidGrammar (param="choice") otherwise.
    """
    choices = parse_json(spec)
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
        raise InvalidGrammar("choice source must be a non-empty JSON list of strings", param="choice")
    return choices


def is_ebnf(source: str) -> bool:
    """True when grammar text is EBNF/GBNF (`rule ::= ...`), False when it reads as Lark (`rule: ...`)."""
    return "::=" in source

"""Spec source parsing: canonical cache keys, closing objects, structural tag validation."""

from __future__ import annotations

import json

import pytest

from constrained import GrammarKind, GrammarSpec, InvalidGrammar, StructuralTag, structural_tag_spec
from constrained.source import canonical_source, close_objects, is_ebnf, load_choices, load_schema
from constrained.structural_tag import parse_structural_tag

K = GrammarKind


def test_canonical_source_is_compact_and_keeps_key_order():
    spec = GrammarSpec(K.JSON_SCHEMA, '{ "b": 1,\n "a": "é" }')
    assert canonical_source(spec) == '{"b":1,"a":"é"}'
    assert canonical_source(GrammarSpec(K.JSON_OBJECT, "ignored")) == ""
    assert canonical_source(GrammarSpec(K.REGEX, " a+ ")) == " a+ "
    with pytest.raises(InvalidGrammar, match="not valid JSON"):
        canonical_source(GrammarSpec(K.CHOICE, "[1,"))


def test_close_objects_walks_subschemas_only():
    schema = {
        "type": "object",
        "properties": {
            "type": {"type": "object", "properties": {}},
            "list": {"type": "array", "items": {"type": "object"}},
            "open": {"type": "object", "additionalProperties": True},
        },
        "anyOf": [{"type": "object"}],
        "$defs": {"d": {"type": "object"}},
        "const": {"type": "object"},
        "default": {"type": "object"},
    }
    closed = close_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["type"]["additionalProperties"] is False
    assert closed["properties"]["list"]["items"]["additionalProperties"] is False
    assert closed["properties"]["open"]["additionalProperties"] is True
    assert closed["anyOf"][0]["additionalProperties"] is False
    assert closed["$defs"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["const"] and "additionalProperties" not in closed["default"]
    assert "additionalProperties" not in schema  # the input is not modified


def test_load_schema_and_choices():
    assert load_schema(GrammarSpec(K.JSON_OBJECT, "")) == {"type": "object"}
    assert load_schema(GrammarSpec(K.JSON_SCHEMA, "true")) is True
    spec = GrammarSpec(K.JSON_SCHEMA, '{"type":"object"}', additional_properties=False)
    assert load_schema(spec) == {"type": "object", "additionalProperties": False}
    assert load_choices(GrammarSpec(K.CHOICE, '["a", ""]')) == ["a", ""]
    for bad in ("[]", '"a"', '["a", null]'):
        with pytest.raises(InvalidGrammar):
            load_choices(GrammarSpec(K.CHOICE, bad))
    assert is_ebnf('root ::= "a"') and not is_ebnf('start: "a"')


def test_structural_tag_round_trip_and_triggers():
    tags = [StructuralTag("<tool_call>{", {"type": "object"}, "}</tool_call>"), StructuralTag("<f=a>", True, "</f>")]
    spec = structural_tag_spec(tags, ["<tool", "<tool_call>", "<f="], additional_properties=False)
    parsed = parse_structural_tag(spec)
    assert [t.begin for t in parsed.tags] == ["<tool_call>{", "<f=a>"]
    assert parsed.tags[0].schema == {"type": "object", "additionalProperties": False}
    assert parsed.trigger_of(parsed.tags[0]) == "<tool_call>"
    assert json.loads(spec.source)["triggers"] == ["<tool", "<tool_call>", "<f="]


@pytest.mark.parametrize(
    "source",
    [
        "[]",
        '{"structures": [{"begin": "<a>", "schema": {}, "end": ""}]}',
        '{"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": [""]}',
        '{"structures": [], "triggers": ["<a"]}',
        '{"structures": [{"begin": "<a>", "end": ""}], "triggers": ["<a"]}',
        '{"structures": [{"begin": 1, "schema": {}, "end": ""}], "triggers": ["<a"]}',
        '{"structures": [{"begin": "<a>", "schema": [], "end": ""}], "triggers": ["<a"]}',
    ],
)
def test_structural_tag_rejects_bad_sources(source):
    with pytest.raises(InvalidGrammar) as info:
        parse_structural_tag(GrammarSpec(K.STRUCTURAL_TAG, source))
    assert info.value.param == "structural_tag"

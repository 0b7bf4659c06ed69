"""json_start_chars: the first characters a schema's JSON may have, checked against real documents."""

from __future__ import annotations

import json

import pytest

from constrained.json_start import ANY_START, WHITESPACE, json_start_chars

DOCUMENTS = [{"a": 1}, [1], "s", -1, 2.5, True, False, None]


@pytest.mark.parametrize(("schema", "starts"), [
    ({"type": "object"}, "{"),
    ({"type": ["array", "null"]}, "[n"),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, '"-0123456789'),
    ({"enum": ["a", 1, None]}, '"1n'),
    ({"const": True}, "t"),
])
def test_typed_schemas_start_with_their_types_characters(schema, starts):
    assert set(json_start_chars(schema)) == set(WHITESPACE + starts)


@pytest.mark.parametrize("schema", [True, {}, {"$ref": "#/$defs/x"}, {"type": "mystery"}])
def test_untyped_schemas_may_start_like_any_json(schema):
    assert json_start_chars(schema) == ANY_START
    assert all(json.dumps(document)[0] in ANY_START for document in DOCUMENTS)


def test_nothing_matches_false():
    assert json_start_chars(False) == WHITESPACE

"""No backend weakens a JSON schema silently: a keyword it would skip makes it refuse the schema.

Each row holds a schema, an instance that breaks only the keyword under test, and a valid instance.
On every backend (and on "auto") the schema either compiles to a grammar that rejects the breaking
instance and accepts the valid one, or raises InvalidGrammar naming the keyword. These rows are the
experiments behind the table in constrained/schema_keywords.py (xgrammar's rules:
constrained/xgrammar_keywords.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from constrained import GrammarCompiler, GrammarConfig, GrammarKind, GrammarSpec, InvalidGrammar
from constrained.regex_features import find_lookaround
from constrained.schema_keywords import GUIDANCE_RULES, check_keywords, find_unenforced
from constrained.xgrammar_keywords import XGRAMMAR_RULES

CASE_012 = {  # /work/shared/cases/012-unsupported-keyword-silent-degenerate.json
    "type": "object",
    "properties": {
        "score": {"type": "integer", "multipleOf": 5},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 12}},
    },
    "required": ["score", "tags"],
    "additionalProperties": False,
    "patternProperties": {"^s": {"type": "integer"}},
}
OBJ_AB = {"a": {"type": "integer"}, "b": {"type": "integer"}}

# (id, schema, breaking instance, valid instance, keyword a refusal must name)
ROWS: list[tuple[str, Any, Any, Any, str]] = [
    ("not", {"type": "integer", "not": {"const": 3}}, 3, 4, "not"),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 1], [1, 2],
     "uniqueItems"),
    ("dependentRequired", {"type": "object", "properties": OBJ_AB, "dependentRequired": {"a": ["b"]}},
     {"a": 1}, {"a": 1, "b": 2}, "dependentRequired"),
    ("dependentSchemas", {"type": "object", "properties": OBJ_AB, "dependentSchemas": {"a": {"required": ["b"]}}},
     {"a": 1}, {"a": 1, "b": 2}, "dependentSchemas"),
    ("if-then", {"type": "object", "properties": OBJ_AB, "if": {"required": ["a"]}, "then": {"required": ["b"]}},
     {"a": 1}, {"b": 1}, "if"),
    ("contains", {"type": "array", "contains": {"const": 5}}, [1], [5], "contains"),
    ("propertyNames", {"type": "object", "propertyNames": {"pattern": "^a"}}, {"b": 1}, {"ab": 1}, "propertyNames"),
    ("unevaluatedProperties", {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False},
     {"b": 1}, {"a": 1}, "unevaluatedProperties"),
    ("allOf", {"allOf": [{"type": "integer"}, {"type": "integer", "minimum": 5}]}, 3, 6, "allOf"),
    ("oneOf-overlap", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, 1, 1.5, "oneOf"),
    ("anyOf-sibling", {"type": "integer", "anyOf": [{"type": "integer", "minimum": 5}, {"type": "integer"}],
                       "maximum": 10}, 11, 6, "maximum"),
    ("ref-sibling", {"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "minimum": 5}, 3, 6, "minimum"),
    ("enum-type", {"type": "string", "enum": ["a", 1]}, 1, "a", "enum"),
    ("pattern-minLength", {"type": "string", "pattern": "^a+$", "minLength": 3}, "aa", "aaa", "minLength"),
    ("format-maxLength", {"type": "string", "format": "email", "maxLength": 8}, "abc@de.com", "a@b.co",
     "maxLength"),
    ("multipleOf-number", {"type": "number", "multipleOf": 0.5}, 0.3, 1.5, "multipleOf"),
    ("required-unlisted", {"type": "object", "properties": {"b": {}}, "required": ["a"]}, {"b": 1}, {"a": 1},
     "required"),
    ("typeless-minLength", {"minLength": 3}, "ab", "abc", "minLength"),
    ("typeless-patternProperties", {"patternProperties": {"^s": {"type": "integer"}}}, {"sa": "x"}, {"sa": 1},
     "patternProperties"),
    ("patternProperties-properties", {"type": "object", "properties": {"a": {"type": "string"}},
                                      "patternProperties": {"^s": {"type": "integer"}}}, {"sb": "y"}, {"sb": 1},
     "patternProperties"),
    ("nested-id", {"$defs": {"a": {"$id": "http://e.org/a", "$defs": {"b": {"type": "integer"}},
                                   "$ref": "#/$defs/b"}, "b": {"type": "string"}}, "$ref": "#/$defs/a"}, "x", 1,
     "$id"),
    ("format-unknown", {"type": "string", "format": "regex"}, "((", "^a$", "format"),
    ("case-012-multipleOf", CASE_012, {"score": 7, "tags": ["abc"]}, {"score": 10, "tags": ["abc"]},
     "patternProperties"),
    ("case-012-minLength", CASE_012, {"score": 5, "tags": ["ab"]}, {"score": 5, "tags": ["abc"], "sx": 3},
     "patternProperties"),
    ("case-012-extra-key", CASE_012, {"score": 5, "tags": ["abc"], "x": 1}, {"score": 5, "tags": []},
     "patternProperties"),
    ("case-012-pattern-key", CASE_012, {"score": 5, "tags": [], "sx": "a"}, {"score": 5, "tags": []},
     "patternProperties"),
]


@pytest.fixture(scope="module")
def compiler(vocab_info, backends):
    compiler = GrammarCompiler(vocab_info, GrammarConfig(), backends=backends)
    yield compiler
    compiler.close()


def accepts(compiler, compiled, encode, eos: int, value: Any) -> bool:
    matcher = compiler.new_matcher(compiled)
    text = json.dumps(value, separators=(",", ":"))
    return all(matcher.accept([t]) for t in [*encode(text), eos]) and matcher.is_terminated()


@pytest.mark.parametrize("backend", ["xgrammar", "guidance", "auto"])
@pytest.mark.parametrize(("schema", "bad", "good", "keyword"), [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_enforced_exactly_or_refused(compiler, encode, vocab_info, backend, schema, bad, good, keyword):
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema), None if backend == "auto" else backend)
    try:
        compiled = compiler.compile(spec)
    except InvalidGrammar as exc:
        assert keyword in exc.message, exc.message
        return
    eos = vocab_info.eos_token_ids[0]
    assert not accepts(compiler, compiled, encode, eos, bad), f"{compiled.backend} accepted {bad}"
    assert accepts(compiler, compiled, encode, eos, good), f"{compiled.backend} rejected {good}"


def test_case_012_refusal_names_the_keyword_and_auto_picks_guidance(compiler):
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(CASE_012), backend="xgrammar")
    with pytest.raises(InvalidGrammar) as info:
        compiler.compile(spec)
    assert info.value.message == ('xgrammar cannot enforce json_schema: "patternProperties" at # '
                                  '(ignored next to "properties")')
    assert info.value.param == "json_schema"
    assert compiler.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(CASE_012))).backend == "guidance"


BAD_PATTERN = {"type": "object", "properties": {"greeting": {"type": "string", "pattern": "^(hello|hi"}},
               "required": ["greeting"], "additionalProperties": False}


@pytest.mark.parametrize("backend", ["xgrammar", "guidance", None])
@pytest.mark.parametrize(("schema", "needles"), [
    pytest.param(BAD_PATTERN, ['pattern "^(hello|hi" at #/properties/greeting'], id="case-009-bad-pattern"),
    pytest.param({"type": "object", "properties": {"a": {"type": "notatype"}}},
                 ['"type" at #/properties/a is "notatype"'], id="notatype"),
    pytest.param({"type": "notatype"}, ['"notatype"'], id="notatype-root"),
    pytest.param({"type": []}, ['"type" at # is []'], id="empty-type-list"),
    pytest.param({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
                 ["'#/$defs/missing' at #/properties/a points to nothing"], id="dangling-ref"),
])
def test_case_009_bad_schemas_are_invalid_grammar(compiler, backend, schema, needles):
    with pytest.raises(InvalidGrammar) as info:
        compiler.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema), backend))
    assert info.value.param == "json_schema"
    for needle in needles:
        assert needle in info.value.message, info.value.message


def test_pointers_reachability_and_vacuous_values():
    schema = {
        "type": "object",
        "properties": {"a/b": {"$ref": "#/$defs/used"}, "c": {"type": "array", "uniqueItems": False}},
        "dependentRequired": {},
        "$defs": {"used": {"type": "integer", "not": {"const": 1}}, "unused": {"not": {}}},
        "title": "annotations", "description": "never refused", "examples": [{"not": 1}],
        "x-vendor": {"uniqueItems": True},
    }
    for rules in (XGRAMMAR_RULES, GUIDANCE_RULES):
        assert [str(u) for u in find_unenforced(schema, rules)] == ['"not" at #/$defs/used (not implemented)']
    assert find_unenforced({"type": "integer", "format": "int32"}, GUIDANCE_RULES) == []  # format is for strings
    assert find_unenforced({"if": {"required": ["a"]}}, XGRAMMAR_RULES) == []  # no then/else: no effect


DRAFT_04 = "http://json-schema.org/draft-04/schema#"
DRAFT_07 = "http://json-schema.org/draft-07/schema#"


@pytest.mark.parametrize("backend", ["xgrammar", "guidance", None])
def test_keywords_of_later_drafts_are_annotations(compiler, encode, vocab_info, backend):
    # propertyNames (draft-06) means nothing in a draft-04 schema; up to draft-07 "$ref" hides its
    # siblings. Ignoring them is exact, so these compile (a backend may still be stricter).
    cases = [({"$schema": DRAFT_04, "type": "object", "propertyNames": {"pattern": "^a"}}, 5),
             ({"$schema": DRAFT_07, "definitions": {"n": {"type": "integer"}}, "$ref": "#/definitions/n",
               "minimum": 5}, "x")]
    for schema, invalid in cases:
        compiled = compiler.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema), backend))
        assert not accepts(compiler, compiled, encode, vocab_info.eos_token_ids[0], invalid)
    assert find_unenforced({**cases[0][0], "$schema": DRAFT_07}, GUIDANCE_RULES)  # defined from draft-06 on


def test_oneof_disjoint_branches_compile_on_xgrammar(compiler, encode, vocab_info):
    schema = {"oneOf": [
        {"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}}, "required": ["k", "x"]},
        {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]},
        {"type": "string"},
    ]}
    compiled = compiler.compile(GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema), "xgrammar"))
    eos = vocab_info.eos_token_ids[0]
    assert accepts(compiler, compiled, encode, eos, {"k": "b"}) and accepts(compiler, compiled, encode, eos, "s")
    assert not accepts(compiler, compiled, encode, eos, {"k": "a", "x": "s"})


def test_message_lists_at_most_max_listed():
    schema = {"type": "object", "properties": {f"p{i}": {"not": {}} for i in range(12)}}
    with pytest.raises(InvalidGrammar, match="; and 4 more$"):
        check_keywords(schema, XGRAMMAR_RULES, "json_schema")


@pytest.mark.parametrize(
    ("regex", "offset"),
    [("(?=b)abc", 0), ("a(?!a)", 1), ("(?<=x)y", 0), ("(?<!x)y", 0), ("[a-z](?=a)", 5), ("[](?=a)", 2),
     ("\\(?=a)", None), ("[(?=]", None), ("(?<name>a)", None), ("(?:ab)+", None), ("[\\]](?!a)", 4)],
)
def test_find_lookaround(regex, offset):
    assert find_lookaround(regex) == offset


@pytest.mark.parametrize(
    "spec",
    [GrammarSpec(GrammarKind.REGEX, "^(?=[0-9])[a-z0-9]{4}$"),
     GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps({"type": "string", "pattern": "(?!a)abc"})),
     GrammarSpec(GrammarKind.JSON_SCHEMA,
                 json.dumps({"type": "object", "properties": {"k": {"type": "string", "pattern": "x(?<=x)"}}}))],
)
def test_xgrammar_refuses_lookaround_it_would_drop(backends, spec):
    with pytest.raises(InvalidGrammar, match="lookaround"):
        backends["xgrammar"].compile(spec)

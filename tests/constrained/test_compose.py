"""constrained/compose.py on both backends: what the composed grammars accept and refuse.

Each text is tokenized with SmolLM2, fed token by token, then EOS; accepted means every token was
taken and the matcher terminated. The calls are JSON between literal tags, as a tool format writes
them (tests/toolparsers/test_tool_grammar.py does the same through the real parsers).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from constrained import (
    GrammarKind,
    GrammarSpec,
    InvalidGrammar,
    NotComposable,
    StructuralTag,
    answer_or_calls,
    tool_calls_grammar,
)
from constrained.structural_tag import parse_structural_tag

K = GrammarKind
ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
ARGS_F = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
TAGS = (StructuralTag("<call>f:", ARGS_F, "</call>"), StructuralTag("<call>g:", True, "</call>"))
CALL_F, CALL_G = '<call>f:{"x": 1}</call>', "<call>g:[1, 2]</call>"
TWO_CALLS = CALL_F + "\n" + CALL_G
ANSWER_SPEC = GrammarSpec(K.JSON_SCHEMA, json.dumps(ANSWER))


def calls(forced: bool = False, single: bool = False):
    return tool_calls_grammar(TAGS, "<call>", "\n", forced=forced, single=single)


@pytest.fixture
def accepts(backend, run_text):
    """accepts(spec, text): True when `backend` takes every token of `text`, then EOS."""

    def run(spec: GrammarSpec, text: str) -> bool:
        rejected_at, matcher = run_text(backend, spec, text)
        return rejected_at is None and matcher.is_terminated()

    return run


def test_answer_or_calls_accepts_the_answer_or_calls_and_nothing_else(accepts):
    spec = answer_or_calls(ANSWER_SPEC, calls())
    assert spec.kind == K.STRUCTURAL_TAG
    for text in ('{"answer": "hi"}', '{"answer": "hi", "extra": 1}', CALL_F, CALL_G, TWO_CALLS):
        assert accepts(spec, text), text
    for text in ('{"answer": 1}', "{}", "Sure.", "", "Sure. " + CALL_F, '{"answer": "hi"}' + CALL_F,
                 CALL_F + '{"answer": "hi"}', CALL_F + " done", '<call>f:{"x": "one"}</call>',
                 '<call>f:{"x": 1, "y": 2}</call>', "<call>h:{}</call>", CALL_F[:-4]):
        assert not accepts(spec, text), text


def test_answer_or_one_call_when_calls_are_not_parallel(accepts):
    spec = answer_or_calls(ANSWER_SPEC, calls(single=True))
    assert accepts(spec, CALL_G) and accepts(spec, '{"answer": ""}')
    assert not accepts(spec, TWO_CALLS)


def test_json_object_answer_and_the_answers_options(accepts):
    spec = answer_or_calls(GrammarSpec(K.JSON_OBJECT, "", any_whitespace=False), calls())
    assert accepts(spec, '{"a":[1,{"b":null}]}') and accepts(spec, '<call>f:{"x":1}</call>')
    assert not accepts(spec, "[1]") and not accepts(spec, '{"a": 1}')   # compact JSON only
    assert not accepts(spec, CALL_F)                                     # in the calls too
    closed = answer_or_calls(dataclasses.replace(ANSWER_SPEC, additional_properties=False), calls())
    assert accepts(closed, '{"answer": "hi"}') and not accepts(closed, '{"answer": "hi", "extra": 1}')


def test_fixed_layout_calls_beside_an_answer_with_free_whitespace(accepts):
    fixed = tuple(dataclasses.replace(tag, fixed_layout=True) for tag in TAGS)
    spec = answer_or_calls(ANSWER_SPEC, tool_calls_grammar(fixed, "<call>", "\n", forced=False, single=False))
    assert accepts(spec, '{ "answer":  "hi" }') and accepts(spec, CALL_F) and accepts(spec, TWO_CALLS)
    for spaced in ('<call>f:{ "x": 1}</call>', '<call>f:{"x":1}</call>', '<call>f: {"x": 1}</call>',
                   "<call>g:[1,2]</call>"):
        assert not accepts(spec, spaced), spaced


def test_open_calls_keep_their_schemas_as_written(accepts):
    spec = answer_or_calls(ANSWER_SPEC, calls(), close_calls=False)
    assert accepts(spec, '<call>f:{"x": 1, "y": 2}</call>')


def test_forced_calls_at_least_one_or_exactly_one(accepts):
    required = calls(forced=True).spec()
    one = calls(forced=True, single=True).spec()
    for spec in (required, one):
        assert accepts(spec, CALL_F) and accepts(spec, CALL_G)
        assert not accepts(spec, "") and not accepts(spec, "Sure. " + CALL_F) and not accepts(spec, CALL_F + " ok")
        assert not accepts(spec, '<call>f:{"x": "one"}</call>')
    assert accepts(required, TWO_CALLS) and not accepts(one, TWO_CALLS)
    assert not accepts(required, CALL_F + CALL_G)     # exactly the separator between calls


def test_auto_calls_free_text_until_the_trigger(accepts):
    auto, one = calls().spec(), calls(single=True).spec()
    for spec in (auto, one):
        assert accepts(spec, "") and accepts(spec, "No call needed.") and accepts(spec, "Let me see. " + CALL_F)
        assert not accepts(spec, "Let me see. <call>f:{}</call>") and not accepts(spec, "Let me see. <call>")
        assert not accepts(spec, "Let me see. <call>h:{}</call>")
    assert accepts(auto, f"A {CALL_F} B {CALL_G} C")
    assert not accepts(one, f"{CALL_F} B") and not accepts(one, TWO_CALLS)


def test_xml_style_calls_beside_an_answer_compile_on_xgrammar_only(backend, accepts):
    xml = tool_calls_grammar([StructuralTag("<f>", ARGS_F, "</f>", "qwen_xml")], "<f>", "\n",
                             forced=False, single=False)
    spec = answer_or_calls(ANSWER_SPEC, xml)
    if backend.name == "guidance":
        with pytest.raises(InvalidGrammar, match="qwen_xml"):
            backend.compile(spec)
        return
    assert accepts(spec, "<f><parameter=x>1</parameter></f>") and accepts(spec, '{"answer": "a"}')
    assert not accepts(spec, "<f><parameter=x>one</parameter></f>")


def test_calls_that_start_like_the_answer_compile_on_xgrammar_only(backend, accepts):
    """llama3_json-like calls (`{"name": ...`) beside an object answer: llguidance cannot tell them
    apart, so guidance refuses and "auto" takes xgrammar, which accepts both."""
    json_like = tool_calls_grammar([StructuralTag('{"call": "f", "args": ', ARGS_F, "}")], '{"call": ', "; ",
                                   forced=False, single=False)
    spec = answer_or_calls(ANSWER_SPEC, json_like)
    if backend.name == "guidance":
        with pytest.raises(InvalidGrammar, match="starts like the JSON answer"):
            backend.compile(spec)
        array_answer = answer_or_calls(GrammarSpec(K.JSON_SCHEMA, '{"type": "array"}'), calls())
        assert accepts(array_answer, "[1]") and accepts(array_answer, CALL_F)   # "<" cannot start an array
        return
    assert accepts(spec, '{"answer": "a"}') and accepts(spec, '{"call": "f", "args": {"x": 1}}')
    assert accepts(spec, '{"call": "f", "args": {"x": 1}}; {"call": "f", "args": {"x": 2}}')
    assert not accepts(spec, '{"call": "f", "args": {"x": "1"}}')


def test_the_composed_spec_forces_and_closes_the_calls_and_keeps_their_joins():
    composed = parse_structural_tag(answer_or_calls(ANSWER_SPEC, calls()))
    assert composed.forced and composed.answer == ANSWER
    assert composed.tags[0].schema == {**ARGS_F, "additionalProperties": False}
    assert composed.separator == "\n" and not composed.stop_after_first
    assert parse_structural_tag(answer_or_calls(ANSWER_SPEC, calls(single=True))).stop_after_first


def test_what_cannot_be_composed_says_which_part():
    """The answer part here; calls that are not structural tags: test_tool_grammar (pythonic)."""
    with pytest.raises(NotComposable, match="regex") as info:
        answer_or_calls(GrammarSpec(K.REGEX, "a+"), calls())
    assert info.value.part == "answer" and isinstance(info.value, InvalidGrammar)


def test_an_answer_needs_forced_calls():
    source = {"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": ["<a"], "answer": {}}
    with pytest.raises(InvalidGrammar, match="'answer' needs 'forced'"):
        parse_structural_tag(GrammarSpec(K.STRUCTURAL_TAG, json.dumps(source)))


def test_answer_schema_errors_name_its_pointer(backend):
    bad = GrammarSpec(K.JSON_SCHEMA, json.dumps({"type": "array", "uniqueItems": True}))
    with pytest.raises(InvalidGrammar, match="uniqueItems.*#/answer"):
        backend.compile(answer_or_calls(bad, calls()))

"""GrammarCloser: from any prefix of a valid output, the plan reaches an accepting end whose text
parses and validates, and planning leaves the matcher where it was."""

from __future__ import annotations

import json

import jsonschema
import pytest

from constrained import GrammarKind, GrammarSpec
from constrained.closing import GrammarCloser
from toolparsers import get_tool_parser
from toolparsers.base import ToolSpec

SCHEMAS = {
    "answer": (
        {"type": "object", "properties": {"answer": {"type": "string"},
                                          "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                                          "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
         "required": ["answer", "confidence", "tags"], "additionalProperties": False},
        {"answer": "Black holes are regions of spacetime", "confidence": 0.9, "tags": ["space", "gravity"]},
    ),
    "nested": (
        {"type": "object", "required": ["title", "points", "level"], "additionalProperties": False,
         "properties": {"title": {"type": "string", "minLength": 3},
                        "points": {"type": "array", "minItems": 2, "items": {
                            "type": "object", "required": ["k", "v"], "additionalProperties": False,
                            "properties": {"k": {"type": "string"}, "v": {"type": "integer"}}}},
                        "level": {"type": "string", "enum": ["easy", "medium", "hard"]}}},
        {"title": "Sourdough \u00e9t\u00e9 \u2014 50%", "points": [{"k": "flour", "v": 500}, {"k": "water", "v": 350}],
         "level": "medium"},
    ),
}


@pytest.fixture(scope="module")
def closer(vocab_info) -> GrammarCloser:
    return GrammarCloser(vocab_info)


def _check_every_prefix(backend, spec, text, encode, tokenizer, closer, validate) -> None:
    ids = encode(text)
    matcher = backend.new_matcher(backend.compile(spec))
    for k in range(len(ids) + 1):
        plan = closer.plan(matcher, limit=64)
        assert plan is not None, f"no plan after {tokenizer.decode(ids[:k])!r}"
        validate(tokenizer.decode(ids[:k] + plan))
        if k == len(ids):
            assert plan == []
            break
        assert matcher.accept([ids[k]]), "planning changed the matcher's state"


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_closes_from_every_prefix(backend, name, encode, tokenizer, closer):
    schema, instance = SCHEMAS[name]
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema), any_whitespace=False)
    _check_every_prefix(backend, spec, json.dumps(instance, ensure_ascii=False, separators=(",", ":")),
                        encode, tokenizer, closer, lambda text: jsonschema.validate(json.loads(text), schema))


WEATHER_TOOL = ToolSpec(name="get_weather", parameters={"type": "object", "properties": {
    "location": {"type": "string"}}, "required": ["location"]})


def _forced_call_check(parser: str, params: dict, arguments_start: str, query: str):
    """(grammar spec, validate) of a forced call in `parser`'s format to search_web (`params`) or
    get_weather: validate(output) checks that it parses to one call whose arguments validate and,
    once the text before `arguments_start` names search_web, that it is that call with a prefix of
    `query` as its query."""
    tools = [ToolSpec(name="search_web", parameters=params), WEATHER_TOOL]
    parser_class = get_tool_parser(parser)

    def validate(output: str) -> None:
        [call] = parser_class(tools).parse(output).tool_calls
        arguments = json.loads(call.arguments)
        jsonschema.validate(arguments, {t.name: t.parameters for t in tools}[call.name])
        if "search_web" in output.split(arguments_start)[0]:
            assert call.name == "search_web" and query.startswith(arguments["query"])

    return parser_class(tools).grammar_for(tools, "required", True), validate


def test_hermes_tool_call_closes_from_every_prefix(backend, encode, tokenizer, closer):
    params = {"type": "object", "properties": {"query": {"type": "string"},
                                               "max_results": {"type": "integer", "minimum": 1, "maximum": 10}},
              "required": ["query"], "additionalProperties": False}
    text = ('<tool_call>\n{"name": "search_web", "arguments": {"query": "2018 world cup winner", '
            '"max_results": 3}}\n</tool_call>')
    spec, validate = _forced_call_check("hermes", params, '"arguments"', "2018 world cup winner")
    _check_every_prefix(backend, spec, text, encode, tokenizer, closer, validate)


def test_qwen3_coder_tool_call_closes_from_every_prefix(backends, encode, tokenizer, closer):
    """qwen3_coder's XML parameters (structural tag style qwen_xml, xgrammar only): inside a value
    the closer writes `</parameter>` (not a JSON quote, which is only more of the value), then
    `</function>` and `</tool_call>`; the parsed call validates, its values the text cut so far."""
    params = {"type": "object", "required": ["query", "max_results"], "additionalProperties": False,
              "properties": {"query": {"type": "string"}, "site": {"type": "string"},
                             "max_results": {"type": "integer", "minimum": 1, "maximum": 10}}}
    text = ("<tool_call>\n<function=search_web>\n<parameter=query>\n2018 world cup \"winner\"}\n"
            "</parameter>\n<parameter=max_results>\n10\n</parameter>\n</function>\n</tool_call>")
    spec, validate = _forced_call_check("qwen3_coder", params, "<parameter=", '2018 world cup "winner"}')
    _check_every_prefix(backends["xgrammar"], spec, text, encode, tokenizer, closer, validate)


def test_plan_respects_limit_and_terminated(backend, encode, closer, vocab_info):
    schema, instance = SCHEMAS["nested"]
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(schema), any_whitespace=False)
    matcher = backend.new_matcher(backend.compile(spec))
    assert matcher.accept(encode('{"title'))
    full = closer.plan(matcher, limit=64)
    assert full is not None and len(full) > 2
    assert closer.plan(matcher, limit=2) is None
    assert closer.plan(matcher, limit=len(full)) == full
    assert matcher.accept(full + [vocab_info.eos_token_ids[0]])
    assert matcher.is_terminated() and closer.plan(matcher, limit=64) is None

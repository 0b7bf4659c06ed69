"""grammar_for: the constraint each parser renders for tool_choice none / auto / required / named.

Every spec is compiled by the real grammar backends (xgrammar, llguidance) and tested by what it
accepts: each format's own call text, tokenized with SmolLM2 and fed token by token then EOS, must
be accepted and parse back to the same calls, while wrong names, bad arguments and free text in
forced mode are refused. A format runs on every backend that compiles it: qwen3_coder's XML
parameters and pythonic's EBNF compile on xgrammar only (tests/constrained/test_structural_tag.py
checks that guidance refuses them by name).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest

from constrained import GrammarKind, GrammarSpec, InvalidGrammar, NotComposable, answer_or_calls
from constrained.structural_tag import parse_structural_tag
from toolparsers import (
    TOOL_PARSERS,
    CallFormat,
    InvalidToolChoice,
    ToolSpec,
    UnknownTool,
    UnsupportedTool,
    get_tool_parser,
)
from toolparsers.call_format import NAME, NAME_JSON

WEATHER = ToolSpec(
    "get_weather",
    "Weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
     "additionalProperties": False},
    strict=True,
)
TIME = ToolSpec("get_time", "Current time")
TOOLS = [WEATHER, TIME]
NAMED = {"type": "function", "function": {"name": "get_weather"}}

# One well-formed call to get_weather {"city": "Dublin"} and one to get_time {}, in each format.
CALLS = {
    "hermes": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Dublin"}}\n</tool_call>',
               '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "\n"),
    "llama3_json": ('{"name": "get_weather", "parameters": {"city": "Dublin"}}',
                    '{"name": "get_time", "parameters": {}}', "; "),
    "qwen3_coder": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nDublin\n</parameter>\n"
                    "</function>\n</tool_call>",
                    "<tool_call>\n<function=get_time>\n\n</function>\n</tool_call>", "\n"),
    "mistral": ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Dublin"}}]',
                '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', None),
    "pythonic": ('[get_weather(city="Dublin")]', "[get_time()]", None),
}
BOTH = {"mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Dublin"}}, '
                   '{"name": "get_time", "arguments": {}}]',
        "pythonic": '[get_weather(city="Dublin"), get_time()]'}
XGRAMMAR_ONLY = ("pythonic", "qwen3_coder")
FORMATS_ON_BACKENDS = [(name, backend) for name in sorted(TOOL_PARSERS) for backend in ("xgrammar", "guidance")
                       if backend == "xgrammar" or name not in XGRAMMAR_ONLY]


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_none_and_auto_without_tools_give_no_grammar(name: str) -> None:
    parser = get_tool_parser(name)()
    assert parser.grammar_for(TOOLS, "none", True) is None
    assert parser.grammar_for([], "auto", True) is None


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_bad_tool_choices_raise(name: str) -> None:
    parser = get_tool_parser(name)()
    with pytest.raises(UnknownTool, match="nope") as info:
        parser.grammar_for(TOOLS, {"type": "function", "function": {"name": "nope"}}, True)
    assert isinstance(info.value, ValueError) and info.value.param == "tool_choice"
    assert "get_weather" in str(info.value)
    with pytest.raises(InvalidToolChoice):
        parser.grammar_for([], "required", True)
    with pytest.raises(InvalidToolChoice):
        parser.grammar_for(TOOLS, "sometimes", True)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(k for k in TOOL_PARSERS if k != "pythonic"))
@pytest.mark.parametrize("choice", ["auto", "required", NAMED, {"name": "get_weather"}])
def test_structural_tags_follow_the_tool_choice(name: str, choice: Any) -> None:
    spec = get_tool_parser(name)().grammar_for(TOOLS, choice, True)
    assert spec is not None and spec.kind == GrammarKind.STRUCTURAL_TAG
    grammar = parse_structural_tag(spec)
    assert grammar.forced == (choice != "auto") and grammar.answer is None
    # Named: one call. Mistral's forced list is a single structure holding every call.
    one_structure = isinstance(choice, dict) or (name == "mistral" and choice == "required")
    assert grammar.stop_after_first == one_structure
    for tag in grammar.tags:
        assert any(tag.begin.startswith(trigger) for trigger in grammar.triggers)
    text = json.dumps([[t.begin, t.schema] for t in grammar.tags])
    assert "get_weather" in text and ("get_time" in text) == (not isinstance(choice, dict))


@pytest.mark.parametrize(("name", "backend"), FORMATS_ON_BACKENDS)
def test_forced_grammar_accepts_only_calls_that_parse(grammar_accepts, name, backend) -> None:
    accepts = partial(grammar_accepts, backend=backend)
    weather, time, separator = CALLS[name]
    parser = get_tool_parser(name)(TOOLS)
    required = parser.grammar_for(TOOLS, "required", True)
    named = parser.grammar_for(TOOLS, NAMED, True)
    single = parser.grammar_for(TOOLS, "required", False)
    assert accepts(required, weather) and accepts(required, time)
    assert accepts(named, weather) and not accepts(named, time)
    assert not accepts(required, "Sure! " + weather)
    assert not accepts(required, weather.replace("get_weather", "get_wether"))
    extra = {"qwen3_coder": ("</parameter>\n", "</parameter>\n<parameter=x>\n1\n</parameter>\n"),
             "pythonic": ('"Dublin"', '"Dublin", x=1')}.get(name, ('"Dublin"', '"Dublin", "x": 1'))
    assert not accepts(required, weather.replace(*extra))  # additionalProperties false
    both = BOTH.get(name) or weather + separator + time
    assert accepts(required, both) and not accepts(single, both) and not accepts(named, both)
    assert [(c.name, c.arguments) for c in parser.parse(both).tool_calls] == [
        ("get_weather", '{"city": "Dublin"}'), ("get_time", "{}")
    ]


@pytest.mark.parametrize(("name", "backend"), FORMATS_ON_BACKENDS)
def test_auto_grammar_allows_text_and_constrains_calls(grammar_accepts, name, backend) -> None:
    accepts = partial(grammar_accepts, backend=backend)
    weather, _, _ = CALLS[name]
    parser = get_tool_parser(name)(TOOLS)
    auto = parser.grammar_for(TOOLS, "auto", True)
    assert accepts(auto, "The weather is fine.")
    assert accepts(auto, weather)
    assert not accepts(auto, weather.replace("get_weather", "get_wether"))
    if name != "pythonic":  # pythonic auto: text or a call list, not text then a list
        assert accepts(auto, "Let me check. " + weather)


# pythonic calls are EBNF, not structural tags; llama3_json calls start like a JSON answer, which
# llguidance cannot tell apart (tests/constrained/test_compose.py: guidance refuses, auto takes xgrammar).
COMPOSABLE = [fb for fb in FORMATS_ON_BACKENDS if fb[0] != "pythonic" and fb != ("llama3_json", "guidance")]


@pytest.mark.parametrize(("name", "backend"), COMPOSABLE)
@pytest.mark.parametrize("parallel", [True, False])
def test_each_format_composes_with_a_json_answer(grammar_accepts, name, backend, parallel) -> None:
    """tool_choice "auto" + a JSON format: the answer, or the format's own calls, nothing else."""
    accepts = partial(grammar_accepts, backend=backend)
    weather, time, separator = CALLS[name]
    answer = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(
        {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}))
    spec = answer_or_calls(answer, get_tool_parser(name)(TOOLS).call_grammar(TOOLS, "auto", parallel))
    assert accepts(spec, '{"answer": "It is sunny."}') and accepts(spec, weather) and accepts(spec, time)
    assert not accepts(spec, '{"answer": 3}') and not accepts(spec, "It is sunny.")
    assert not accepts(spec, "Let me check. " + weather)
    assert not accepts(spec, weather.replace("get_weather", "get_wether"))
    both = BOTH.get(name) or weather + separator + time
    assert accepts(spec, both) == parallel


def test_tools_without_parameters_get_an_object_schema(grammar_accepts) -> None:
    spec = get_tool_parser("hermes")().grammar_for([ToolSpec("ping", parameters={})], "required", True)
    assert spec is not None
    assert parse_structural_tag(spec).tags[0].schema == {"type": "object", "properties": {}}
    for backend in ("xgrammar", "guidance"):
        accepts = partial(grammar_accepts, backend=backend)
        assert accepts(spec, '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>')
        assert not accepts(spec, '<tool_call>\n{"name": "ping", "arguments": "x"}\n</tool_call>')


def test_pythonic_grammar_follows_types_and_required(grammar_accepts) -> None:
    tool = ToolSpec("f", parameters={"type": "object", "required": ["n"], "properties": {
        "n": {"type": "integer"}, "s": {"enum": ["a", "b"]},
        "l": {"type": "array", "items": {"type": "boolean"}},
        "o": {"type": ["string", "null"]}}})
    spec = get_tool_parser("pythonic")().grammar_for([tool], "required", True)
    assert spec is not None and spec.kind == GrammarKind.GRAMMAR and spec.backend == "xgrammar"
    accepts = partial(grammar_accepts, backend="xgrammar")
    assert accepts(spec, '[f(n=1, s="b", l=[True, False], o=None)]')
    assert accepts(spec, '[f(n=-3, o="x")]')
    for bad in ('[f(s="a")]', '[f(n="1")]', '[f(n=1, s="c")]', "[f(n=1, l=[1])]", "[f(s=\"a\", n=1)]"):
        assert not accepts(spec, bad), bad


def test_pythonic_rejects_tool_names_it_cannot_write() -> None:
    with pytest.raises(UnsupportedTool, match="get-weather"):
        get_tool_parser("pythonic")().grammar_for([ToolSpec("get-weather")], "auto", True)
    with pytest.raises(UnsupportedTool, match="get-weather"):   # checked before "cannot be composed"
        get_tool_parser("pythonic")().call_grammar([ToolSpec("get-weather")], "auto", True)


def test_pythonic_calls_cannot_stand_beside_a_json_answer() -> None:
    """Its calls are EBNF, not structural tags: `call_grammar` says which part cannot be composed."""
    parser = get_tool_parser("pythonic")()
    assert parser.call_grammar(TOOLS, "none", True) is None
    with pytest.raises(NotComposable, match="pythonic") as info:
        parser.call_grammar(TOOLS, "auto", True)
    assert info.value.part == "calls" and isinstance(info.value, InvalidGrammar)


@pytest.mark.parametrize("name", sorted(set(TOOL_PARSERS) - {"pythonic"}))
def test_grammar_for_is_the_spec_of_call_grammar(name: str) -> None:
    parser = get_tool_parser(name)(TOOLS)
    for choice in ("auto", "required", NAMED):
        assert parser.grammar_for(TOOLS, choice, False) == parser.call_grammar(TOOLS, choice, False).spec()


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_every_parser_declares_its_call_format(name: str) -> None:
    call_format = get_tool_parser(name).call_format
    weather = CALLS[name][0]
    assert weather.startswith(call_format.trigger) or name == "mistral"  # mistral's grammar writes the v3 list
    assert "get_weather" in call_format.begin_for("get_weather")


def test_call_format_names_and_checks() -> None:
    quoted = CallFormat(f"<x>{NAME_JSON}|{NAME}", "</x>", "<x>")
    assert quoted.begin_for('a"b') == '<x>"a\\"b"|a"b'
    with pytest.raises(ValueError, match="trigger"):
        CallFormat("{name}(", ")", "[")

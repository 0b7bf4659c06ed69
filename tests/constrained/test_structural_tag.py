"""Tool-call structural tags (forced / triggered, stop_after_first, separator, style) on each backend.

The specs come from the real tool parsers (`grammar_for`), the texts are each format's own call
text, tokenized with SmolLM2 and fed token by token, then EOS. Every backend that compiles a spec
must give the same answers, and so must "auto"; guidance refuses style "qwen_xml" (InvalidGrammar),
and "auto" then compiles it with xgrammar.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from constrained import (
    GrammarCompiler,
    GrammarConfig,
    GrammarKind,
    GrammarSpec,
    InvalidGrammar,
    StructuralTag,
    structural_tag_spec,
)
from constrained.structural_tag import parse_structural_tag
from toolparsers import ToolSpec, get_tool_parser

WEATHER = ToolSpec("get_weather", "Weather for a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False,
})
TIME = ToolSpec("get_time", "Current time")
TOOLS = [WEATHER, TIME]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
PARSERS = ("hermes", "llama3_json", "mistral", "qwen3_coder")
BACKENDS = ("xgrammar", "guidance", "auto")


def _call_texts(name: str) -> dict[str, str]:
    """A call to get_weather, one to get_time, both in one output, and a get_weather call whose
    arguments break its schema, in the format of parser `name`."""
    if name == "hermes":
        def call(n: str, args: str) -> str:
            return f'<tool_call>\n{{"name": "{n}", "arguments": {args}}}\n</tool_call>'
        weather, time = call("get_weather", '{"city": "Dublin"}'), call("get_time", "{}")
        return {"weather": weather, "time": time, "both": weather + "\n" + time,
                "bad_args": call("get_weather", '{"city": 1}')}
    if name == "llama3_json":
        def call(n: str, args: str) -> str:
            return f'{{"name": "{n}", "parameters": {args}}}'
        weather, time = call("get_weather", '{"city": "Dublin"}'), call("get_time", "{}")
        return {"weather": weather, "time": time, "both": weather + "; " + time,
                "bad_args": call("get_weather", '{"town": "Dublin"}')}
    if name == "mistral":
        weather = '{"name": "get_weather", "arguments": {"city": "Dublin"}}'
        time = '{"name": "get_time", "arguments": {}}'
        return {"weather": f"[TOOL_CALLS][{weather}]", "time": f"[TOOL_CALLS][{time}]",
                "both": f"[TOOL_CALLS][{weather}, {time}]",
                "bad_args": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": null}}]'}
    def xml(n: str, body: str) -> str:
        return f"<tool_call>\n<function={n}>\n{body}\n</function>\n</tool_call>"
    weather = xml("get_weather", "<parameter=city>\nDublin\n</parameter>")
    return {"weather": weather, "time": xml("get_time", ""), "both": weather + "\n" + xml("get_time", ""),
            "bad_args": xml("get_weather", "<parameter=town>\nDublin\n</parameter>")}


class Runner:
    """Compiles specs on one backend name (or "auto") and runs texts + EOS through fresh matchers."""

    def __init__(self, compiler: GrammarCompiler, backend: str, encode, eos: int) -> None:
        self.compiler, self.backend, self.encode, self.eos = compiler, backend, encode, eos

    def compile(self, spec: GrammarSpec | None) -> Any:
        assert spec is not None
        backend = None if self.backend == "auto" else self.backend
        return self.compiler.compile(GrammarSpec(spec.kind, spec.source, backend))

    def accepts(self, compiled: Any, text: str) -> bool:
        """True when every token of `text` and then EOS is accepted (the matcher terminates)."""
        matcher = self.compiler.new_matcher(compiled)
        for token_id in [*self.encode(text), self.eos]:
            if not matcher.accept([token_id]):
                assert not matcher.is_terminated()
                return False
        return matcher.is_terminated()


@pytest.fixture(scope="module")
def compiler(vocab_info, backends):
    compiler = GrammarCompiler(vocab_info, GrammarConfig(), backends=backends)
    yield compiler
    compiler.close()


@pytest.fixture(params=BACKENDS)
def runner(request, compiler, encode, vocab_info) -> Runner:
    return Runner(compiler, request.param, encode, vocab_info.eos_token_ids[0])


def _compile_or_refuse(runner: Runner, name: str, spec: GrammarSpec | None) -> Any:
    """The compiled spec; for guidance and qwen3_coder (style qwen_xml) the refusal is checked and
    the test skipped."""
    if runner.backend == "guidance" and name == "qwen3_coder":
        with pytest.raises(InvalidGrammar, match="qwen_xml"):
            runner.compile(spec)
        pytest.skip("guidance refuses style qwen_xml (auto falls back to xgrammar)")
    compiled = runner.compile(spec)
    if runner.backend == "auto" and name == "qwen3_coder":
        assert compiled.backend == "xgrammar"
    return compiled


@pytest.mark.parametrize("name", PARSERS)
def test_forced_calls(runner: Runner, name: str) -> None:
    texts = _call_texts(name)
    parser = get_tool_parser(name)(TOOLS)
    required = _compile_or_refuse(runner, name, parser.grammar_for(TOOLS, "required", True))
    named = runner.compile(parser.grammar_for(TOOLS, NAMED, True))
    single = runner.compile(parser.grammar_for(TOOLS, "required", False))
    weather = texts["weather"]
    assert runner.accepts(required, weather) and runner.accepts(required, texts["time"])
    assert runner.accepts(required, texts["both"])
    assert runner.accepts(named, weather) and runner.accepts(single, weather)
    assert not runner.accepts(named, texts["time"])  # another tool than the named one
    assert not runner.accepts(named, texts["both"]) and not runner.accepts(single, texts["both"])
    for spec in (required, named):
        assert not runner.accepts(spec, "Sure! " + weather)  # no text before the call
        assert not runner.accepts(spec, weather + " Done.")  # nor after it
        assert not runner.accepts(spec, weather.replace("get_weather", "get_wether"))
        assert not runner.accepts(spec, texts["bad_args"])
        assert not runner.accepts(spec, weather[:-3])  # EOS inside a call
        assert not runner.accepts(spec, "")


@pytest.mark.parametrize("name", PARSERS)
def test_auto_calls(runner: Runner, name: str) -> None:
    texts = _call_texts(name)
    parser = get_tool_parser(name)(TOOLS)
    auto = _compile_or_refuse(runner, name, parser.grammar_for(TOOLS, "auto", True))
    one = runner.compile(parser.grammar_for(TOOLS, "auto", False))
    weather = texts["weather"]
    trigger = json.loads(parser.grammar_for(TOOLS, "auto", True).source)["triggers"][0]
    for spec in (auto, one):
        assert runner.accepts(spec, "The weather is fine.") and runner.accepts(spec, "")
        assert runner.accepts(spec, weather) and runner.accepts(spec, "Let me check. " + weather)
        assert not runner.accepts(spec, "Let me check. " + texts["bad_args"])
        assert not runner.accepts(spec, "Let me check. " + weather.replace("get_weather", "get_wether"))
        assert not runner.accepts(spec, "Let me check. " + trigger)  # EOS inside a call
        assert not runner.accepts(spec, "Let me check. " + weather[:-3])
    assert runner.accepts(auto, weather + " Done.") and runner.accepts(auto, f"A {weather} B {texts['time']} C")
    assert not runner.accepts(one, weather + " Done.")  # stop_after_first: nothing after the call
    assert not runner.accepts(one, f"{weather} {texts['time']}")


def test_tool_schema_keywords_are_checked(runner: Runner) -> None:
    tool = ToolSpec("tag", parameters={"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}})
    spec = get_tool_parser("hermes")([tool]).grammar_for([tool], "required", True)
    with pytest.raises(InvalidGrammar, match="uniqueItems.*#/structures/0/schema/properties/tags"):
        runner.compile(spec)


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_forced_with_separator_and_special_token_trigger(runner: Runner, tokenizer) -> None:
    tags = [StructuralTag("<repo_name>f:", SCHEMA, ";"), StructuralTag("<repo_name>g:", True, ";")]
    forced = runner.compile(structural_tag_spec(tags, ["<repo_name>"], forced=True, separator=" | "))
    triggered = runner.compile(structural_tag_spec(tags, ["<repo_name>"]))
    for spec in (forced, triggered):
        assert runner.accepts(spec, '<repo_name>f:{"a":1};')
        assert runner.accepts(spec, '<repo_name>f:{"a":1}; | <repo_name>g:[1];')
        assert runner.accepts(spec, '<repo_name>f:{"a":1};<repo_name>g:[1];') == (spec is triggered)
        assert not runner.accepts(spec, '<repo_name>f:{"b":1};')
        assert not runner.accepts(spec, '<repo_name>h:{"a":1};')
    assert runner.accepts(triggered, 'x <repo_name>g:"any";y') and not runner.accepts(forced, "x")


def test_parse_new_fields_and_defaults() -> None:
    legacy = parse_structural_tag(GrammarSpec(GrammarKind.STRUCTURAL_TAG,
                                              '{"structures":[{"begin":"<a>","schema":{},"end":""}],"triggers":["<a"]}'))
    assert (legacy.forced, legacy.stop_after_first, legacy.separator, legacy.tags[0].style) == (False, False, "", "json")
    spec = structural_tag_spec([StructuralTag("<f>", {}, "</f>", "qwen_xml")], [], forced=True,
                               stop_after_first=True, separator=",")
    parsed = parse_structural_tag(spec)
    assert (parsed.forced, parsed.stop_after_first, parsed.separator, parsed.triggers) == (True, True, ",", ())
    assert parsed.tags[0].style == "qwen_xml" and parsed.trigger_of(parsed.tags[0]) == ""
    assert not legacy.tags[0].fixed_layout and '"fixed_layout"' not in spec.source
    fixed = structural_tag_spec([StructuralTag("<f>", {}, "</f>", fixed_layout=True)], ["<f>"])
    assert parse_structural_tag(fixed).tags[0].fixed_layout


@pytest.mark.parametrize(("change", "needle"), [
    ({"forced": "yes"}, "booleans"),
    ({"separator": 1}, "string"),
    ({"triggers": []}, "triggers"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "", "style": "yaml"}]}, "style"),
    ({"structures": [{"begin": "<a>", "schema": {"type": "notatype"}, "end": ""}]}, "notatype"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "", "fixed_layout": 1}]}, "fixed_layout"),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": "", "style": "qwen_xml", "fixed_layout": True}]},
     "fixed_layout"),
    ({"structures": [{"begin": "<a>", "schema": {"$ref": "#/$defs/x"}, "end": ""}]}, "points to nothing"),
])
def test_bad_sources(change: dict[str, Any], needle: str) -> None:
    source = {"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": ["<a"], **change}
    with pytest.raises(InvalidGrammar, match=needle) as info:
        parse_structural_tag(GrammarSpec(GrammarKind.STRUCTURAL_TAG, json.dumps(source)))
    assert info.value.param == "structural_tag"

"""grammar_for: the constraint each parser renders for tool_choice none / auto / required / named.

With xgrammar installed, the specs are compiled (structural tags through the translation the grammar
backends must implement, see `to_xgrammar`) and the format's own call text must be accepted and parse
back to the same call, while wrong names and free text in forced mode are rejected.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from constrained.spec import GrammarKind, GrammarSpec
from toolparsers import (
    TOOL_PARSERS,
    InvalidToolChoice,
    ToolSpec,
    UnknownTool,
    UnsupportedTool,
    get_tool_parser,
)

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


def to_xgrammar(source: str) -> dict[str, Any]:
    """Our STRUCTURAL_TAG source as an xgrammar structural tag (new format): the reference mapping
    the grammar backends implement (see toolparsers/structural.py)."""
    spec = json.loads(source)
    tags = [
        {"type": "tag", "begin": s["begin"], "end": s["end"],
         "content": {"type": "json_schema", "json_schema": s["schema"], "style": s.get("style", "json")}}
        for s in spec["structures"]
    ]
    stop = spec.get("stop_after_first", False)
    if spec.get("forced", False):
        fmt = {"type": "tags_with_separator", "tags": tags, "separator": spec.get("separator", ""),
               "at_least_one": True, "stop_after_first": stop}
    else:
        fmt = {"type": "triggered_tags", "triggers": spec["triggers"], "tags": tags, "stop_after_first": stop}
    return {"type": "structural_tag", "format": fmt}


def _accepts(spec: GrammarSpec, text: str) -> bool:
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    if spec.kind == GrammarKind.STRUCTURAL_TAG:
        grammar = xgr.Grammar.from_structural_tag(json.dumps(to_xgrammar(spec.source)))
    else:
        grammar = xgr.Grammar.from_ebnf(spec.source)
    return bool(_is_grammar_accept_string(grammar, text))


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
def test_structural_tag_sources(name: str, choice: Any) -> None:
    spec = get_tool_parser(name)().grammar_for(TOOLS, choice, True)
    assert spec is not None and spec.kind == GrammarKind.STRUCTURAL_TAG
    source = json.loads(spec.source)
    assert set(source) == {"structures", "triggers", "forced", "stop_after_first", "separator"}
    assert source["forced"] == (choice != "auto")
    # Named: one call. Mistral's forced list is a single structure holding every call.
    one_structure = isinstance(choice, dict) or (name == "mistral" and choice == "required")
    assert source["stop_after_first"] == one_structure
    for structure in source["structures"]:
        assert any(structure["begin"].startswith(trigger) for trigger in source["triggers"])
    text = json.dumps(source["structures"])
    assert "get_weather" in text and ("get_time" in text) == (not isinstance(choice, dict))


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_forced_grammar_accepts_only_calls_that_parse(name: str) -> None:
    weather, time, separator = CALLS[name]
    parser = get_tool_parser(name)(TOOLS)
    required = parser.grammar_for(TOOLS, "required", True)
    named = parser.grammar_for(TOOLS, NAMED, True)
    single = parser.grammar_for(TOOLS, "required", False)
    assert required is not None and named is not None and single is not None
    assert _accepts(required, weather) and _accepts(required, time)
    assert _accepts(named, weather) and not _accepts(named, time)
    assert not _accepts(required, "Sure! " + weather)
    assert not _accepts(required, weather.replace("get_weather", "get_wether"))
    extra = {"qwen3_coder": ("</parameter>\n", "</parameter>\n<parameter=x>\n1\n</parameter>\n"),
             "pythonic": ('"Dublin"', '"Dublin", x=1')}.get(name, ('"Dublin"', '"Dublin", "x": 1'))
    assert not _accepts(required, weather.replace(*extra))  # additionalProperties false
    both = BOTH.get(name) or weather + separator + time
    assert _accepts(required, both) and not _accepts(single, both) and not _accepts(named, both)
    assert [(c.name, c.arguments) for c in parser.parse(both).tool_calls] == [
        ("get_weather", '{"city": "Dublin"}'), ("get_time", "{}")
    ]


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_auto_grammar_allows_text_and_constrains_calls(name: str) -> None:
    weather, _, _ = CALLS[name]
    parser = get_tool_parser(name)(TOOLS)
    auto = parser.grammar_for(TOOLS, "auto", True)
    assert auto is not None
    assert _accepts(auto, "The weather is fine.")
    assert _accepts(auto, weather)
    assert not _accepts(auto, weather.replace("get_weather", "get_wether"))
    if name != "pythonic":  # pythonic auto: text or a call list, not text then a list
        assert _accepts(auto, "Let me check. " + weather)


def test_tools_without_parameters_get_an_object_schema() -> None:
    spec = get_tool_parser("hermes")().grammar_for([ToolSpec("ping", parameters={})], "required", True)
    assert spec is not None
    assert json.loads(spec.source)["structures"][0]["schema"] == {"type": "object", "properties": {}}


def test_pythonic_grammar_follows_types_and_required() -> None:
    tool = ToolSpec("f", parameters={"type": "object", "required": ["n"], "properties": {
        "n": {"type": "integer"}, "s": {"enum": ["a", "b"]},
        "l": {"type": "array", "items": {"type": "boolean"}},
        "o": {"type": ["string", "null"]}}})
    spec = get_tool_parser("pythonic")().grammar_for([tool], "required", True)
    assert spec is not None and spec.kind == GrammarKind.GRAMMAR and spec.backend == "xgrammar"
    assert _accepts(spec, '[f(n=1, s="b", l=[True, False], o=None)]')
    assert _accepts(spec, '[f(n=-3, o="x")]')
    for bad in ('[f(s="a")]', '[f(n="1")]', '[f(n=1, s="c")]', "[f(n=1, l=[1])]", "[f(s=\"a\", n=1)]"):
        assert not _accepts(spec, bad), bad


def test_pythonic_rejects_tool_names_it_cannot_write() -> None:
    with pytest.raises(UnsupportedTool, match="get-weather"):
        get_tool_parser("pythonic")().grammar_for([ToolSpec("get-weather")], "auto", True)

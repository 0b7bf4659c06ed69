"""PythonicParser: `[f(a=1), g()]` lists parsed with `ast`, anywhere in the text (case 005)."""

from __future__ import annotations

import json

from toolparsers.base import ParseResult
from toolparsers.pythonic import PythonicParser


def _calls(result: ParseResult) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in result.tool_calls]


def test_case_005_call_after_a_sentence() -> None:
    result = PythonicParser().parse('Let me check. [get_weather(city="Dublin")]')
    assert result.content == "Let me check."
    assert _calls(result) == [("get_weather", '{"city": "Dublin"}')]


def test_literals_become_json() -> None:
    text = "[f(s='it\\'s ü', n=None, b=False, t=(1, 2), d={'k': [1.5]}), g()]"
    result = PythonicParser().parse(text)
    assert [name for name, _ in _calls(result)] == ["f", "g"]
    assert json.loads(result.tool_calls[0].arguments) == {
        "s": "it's ü", "n": None, "b": False, "t": [1, 2], "d": {"k": [1.5]}
    }
    assert result.tool_calls[1].arguments == "{}"


def test_non_literal_or_positional_calls_stay_content() -> None:
    for text in ("[f(1)]", "[f(**kw)]", "[g(1), f(x=1)]"):
        result = PythonicParser().parse(text)
        assert result.content == text and result.tool_calls == []


def test_malformed_calls_after_a_streamed_header_keep_the_models_source() -> None:
    """`[f(x=` streamed a header: the call stays, its arguments end with the source verbatim."""
    for text, calls, content in (
        ("[f(x=y)]", [("f", "{x=y)")], ""),
        ("[f(x=set())]", [("f", "{x=set())")], ""),
        ("[f(a=1, x=float('nan'))]", [("f", '{"a": 1, x=float(\'nan\'))')], ""),
        ("[f(x=1), 3]", [("f", '{"x": 1}')], "3"),
        ("[f(x=1, y=", [("f", '{"x": 1, y=')], ""),
    ):
        result = PythonicParser().parse(text)
        assert [(c.name, c.arguments) for c in result.tool_calls] == calls and result.content == content, text


def test_prose_brackets_are_not_held_forever() -> None:
    parser = PythonicParser()
    assert parser.feed("See [1] and [note] ").content == "See [1] and [note]"
    assert parser.feed("[get").content == ""
    assert parser.feed("_time()]").tool_calls[0].name == "get_time"

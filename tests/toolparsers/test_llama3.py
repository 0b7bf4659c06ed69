"""Llama3JsonParser: `{"name", "parameters"}` objects, `<|python_tag|>`, ";" separators."""

from __future__ import annotations

from toolparsers.base import ParseResult
from toolparsers.llama3 import Llama3JsonParser

DUBLIN = '{"name": "get_weather", "parameters": {"city": "Dublin"}}'


def _calls(result: ParseResult) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in result.tool_calls]


def test_python_tag_and_separators_are_not_content() -> None:
    result = Llama3JsonParser().parse("<|python_tag|>" + DUBLIN + "; " + DUBLIN.replace("Dublin", "Oslo"))
    assert result.content == ""
    assert _calls(result) == [("get_weather", '{"city": "Dublin"}'), ("get_weather", '{"city": "Oslo"}')]


def test_case_005_text_around_the_call() -> None:
    result = Llama3JsonParser().parse("Let me check. " + DUBLIN + " Back soon.")
    assert result.content == "Let me check.\nBack soon."
    assert _calls(result) == [("get_weather", '{"city": "Dublin"}')]


def test_type_function_prefix_and_arguments_alias() -> None:
    text = '{"type": "function", "name": "f", "arguments": {"s": "ü \\"x\\""}}'
    assert _calls(Llama3JsonParser().parse(text)) == [("f", '{"s": "ü \\"x\\""}')]


def test_other_json_and_malformed_calls_stay_content() -> None:
    for text in (
        'Config: {"debug": true, "name": "x"}',
        '{"name": "f", "parameters": [1, 2]}',
        '{"parameters": {"a": 1}, "name": "f"',
    ):
        result = Llama3JsonParser().parse(text)
        assert result.content == text and result.tool_calls == []


def test_malformed_calls_after_a_streamed_header_keep_the_models_text() -> None:
    for text, arguments in (
        ('{"name": "f", "parameters": {"a": 1}', '{"a": 1}'),
        ('{"name": "f", "parameters": {"a": }}', '{"a": }'),
        ('{"name": "f", "parameters": {"a": 1', '{"a": 1'),
    ):
        result = Llama3JsonParser().parse(text)
        assert result.content == "" and _calls(result) == [("f", arguments)]


def test_partial_start_is_held_back() -> None:
    parser = Llama3JsonParser()
    assert parser.feed('Ok {"na').content == "Ok"
    assert parser.feed('me": "f"').content == ""
    assert _calls(parser.feed(', "parameters": {}}')) == [("f", "{}")]
    assert parser.finish().content == ""

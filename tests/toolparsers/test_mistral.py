"""MistralParser: `[TOOL_CALLS]` with a JSON list (v3) or `name[ARGS]{...}` (v11+)."""

from __future__ import annotations

from toolparsers.base import ParseResult
from toolparsers.mistral import MistralParser


def _calls(result: ParseResult) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in result.tool_calls]


def test_json_list_form_with_several_calls() -> None:
    text = 'Sure.[TOOL_CALLS][{"name": "a", "arguments": {"x": "ü"}}, {"name": "b", "arguments": {}}]'
    result = MistralParser().parse(text)
    assert result.content == "Sure."
    assert _calls(result) == [("a", '{"x": "ü"}'), ("b", "{}")]


def test_args_form_with_and_without_call_id() -> None:
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Dublin"}[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS]{} done'
    result = MistralParser().parse(text)
    assert _calls(result) == [("get_weather", '{"city": "Dublin"}'), ("f", "{}")]
    assert result.content == "done"


def test_malformed_blocks_are_content() -> None:
    for text in (
        "[TOOL_CALLS] I cannot call tools.",
        '[TOOL_CALLS][{"name": "a", "arguments": [1]}]',
        "[TOOL_CALLS]get_weather[ARGS]not json",
    ):
        result = MistralParser().parse(text)
        assert result.content == text and result.tool_calls == []


def test_malformed_blocks_after_a_streamed_header_keep_their_calls() -> None:
    for text, calls, content in (
        ('[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}', [("a", '{"x": 1}')], ""),
        ('[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, oops]', [("a", '{"x": 1}')], ", oops"),
        ('[TOOL_CALLS][{"name": "a", "arguments": {"x": }}]', [("a", '{"x": }')], ""),
        ('[TOOL_CALLS]f[ARGS]{"x": tru}', [("f", '{"x": tru}')], ""),
        ('[TOOL_CALLS]f[ARGS]{"x": "un', [("f", '{"x": "un')], ""),
    ):
        result = MistralParser().parse(text)
        assert [(c.name, c.arguments) for c in result.tool_calls] == calls and result.content == content, text


def test_partial_marker_is_held_back() -> None:
    parser = MistralParser()
    assert parser.feed("Hi [TOOL_").content == "Hi"
    assert parser.feed('CALLS]f[ARGS]{"a"').content == ""
    assert _calls(parser.feed(": 1}")) == [("f", '{"a": 1}')]

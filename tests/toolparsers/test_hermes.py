"""HermesParser: `<tool_call>` JSON blocks, position-independent and lossless (case 005)."""

from __future__ import annotations

import json

from toolparsers.base import ParseResult
from toolparsers.hermes import HermesParser

DUBLIN = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Dublin"}}\n</tool_call>'


def _calls(result: ParseResult) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in result.tool_calls]


def _stream_chars(text: str) -> ParseResult:
    parser = HermesParser()
    merged = ParseResult()
    for char in text:
        merged.extend(parser.feed(char))
    merged.extend(parser.finish())
    return merged


def test_case_005_text_before_the_call_whole_and_streamed() -> None:
    for text in ("Let me check." + DUBLIN, "Let me check.\n" + DUBLIN + "\n"):
        for result in (HermesParser().parse(text), _stream_chars(text)):
            assert result.content == "Let me check."
            assert _calls(result) == [("get_weather", '{"city": "Dublin"}')]


def test_text_after_the_call_is_content() -> None:
    result = HermesParser().parse("Checking.\n" + DUBLIN + "\nI will report back.")
    assert result.content == "Checking.\nI will report back."
    assert len(result.tool_calls) == 1


def test_malformed_block_is_returned_verbatim() -> None:
    broken = '<tool_call>\n{"arguments": {"city": }, "name": "get_weather"}\n</tool_call>'
    result = HermesParser().parse("Let me check." + broken)
    assert result.content == "Let me check." + broken
    assert result.tool_calls == []
    assert _stream_chars("Let me check." + broken).content == "Let me check." + broken


def test_malformed_arguments_after_the_header_stay_the_calls_text_verbatim() -> None:
    """The header streamed, so the call stays a call; its arguments are what the model wrote."""
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    for result in (HermesParser().parse("Let me check." + broken), _stream_chars("Let me check." + broken)):
        assert result.content == "Let me check."
        assert _calls(result) == [("get_weather", '{"city": }')]
    streamed = [d.arguments_delta for d in _stream_chars(broken).deltas if d.arguments_delta]
    assert streamed[-1] == "}" and "".join(streamed[:-1]) == '{"city": '


def test_partial_call_at_end_is_content() -> None:
    text = 'Sure <tool_call>\n{"name": "get_weather", "argum'
    assert HermesParser().parse(text).content == text
    assert _stream_chars(text).content == text


def test_several_calls_get_their_own_index_and_id() -> None:
    text = DUBLIN + "\n" + DUBLIN.replace("Dublin", "Paris") + "\n" + DUBLIN.replace("Dublin", "Rome")
    result = _stream_chars(text)
    assert [c for c in _calls(result)] == [
        ("get_weather", '{"city": "Dublin"}'),
        ("get_weather", '{"city": "Paris"}'),
        ("get_weather", '{"city": "Rome"}'),
    ]
    headers = [d for d in result.deltas if d.name is not None]
    assert [d.index for d in headers] == [0, 1, 2]
    assert [d.index for d in result.deltas] == sorted(d.index for d in result.deltas)
    assert len({c.id for c in result.tool_calls}) == 3
    assert result.content == ""


def test_unicode_and_escapes_keep_the_models_exact_json() -> None:
    raw = '{"text": "Zürich 🌞 \\"quoted\\" back\\\\slash \\u2603 tab\\t", "n": 1.50}'
    result = HermesParser().parse(f'<tool_call>{{"name": "note", "arguments": {raw}}}</tool_call>')
    assert _calls(result) == [("note", raw)]
    assert json.loads(result.tool_calls[0].arguments)["text"] == 'Zürich 🌞 "quoted" back\\slash ☃ tab\t'


def test_end_marker_inside_a_string_does_not_end_the_block() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"t": "</tool_call>"}}</tool_call>'
    assert _calls(HermesParser().parse(text)) == [("f", '{"t": "</tool_call>"}')]


def test_missing_brace_only_spoils_its_own_block() -> None:
    text = '<tool_call>{"arguments": {"a": 1}, "name": "f"</tool_call>' + DUBLIN
    result = HermesParser().parse(text)
    assert result.content == '<tool_call>{"arguments": {"a": 1}, "name": "f"</tool_call>'
    assert _calls(result) == [("get_weather", '{"city": "Dublin"}')]


def test_missing_outer_brace_after_a_streamed_header_keeps_the_call() -> None:
    text = '<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>' + DUBLIN
    result = HermesParser().parse(text)
    assert result.content == ""
    assert _calls(result) == [("f", '{"a": 1}'), ("get_weather", '{"city": "Dublin"}')]


def test_argument_variants() -> None:
    parse = HermesParser().parse
    assert _calls(parse('<tool_call>{"name": "get_time"}</tool_call>')) == [("get_time", "{}")]
    assert _calls(parse('<tool_call>{"name": "f", "arguments": null}</tool_call>')) == [("f", "{}")]
    for body in ('"parameters": {"a": 1}', '"arguments": "{\\"a\\": 1}"'):
        assert _calls(parse(f'<tool_call>{{"name": "f", {body}}}</tool_call>')) == [("f", '{"a": 1}')]
    for bad in ('"Paris"', "[1]", "3"):
        text = f'<tool_call>{{"name": "f", "arguments": {bad}}}</tool_call>'
        assert parse(text).tool_calls == [] and parse(text).content == text


def test_unclosed_final_block_with_complete_json_is_a_call() -> None:
    result = HermesParser().parse('<tool_call>\n{"name": "get_time", "arguments": {}}\n')
    assert _calls(result) == [("get_time", "{}")] and result.content == ""


def test_partial_marker_is_held_back_then_flushed() -> None:
    parser = HermesParser()
    first = parser.feed("Hello <tool")
    assert first.content == "Hello" and first.deltas == []
    assert parser.feed("_c").content == ""
    assert parser.finish().content == " <tool_c"


def test_parse_does_not_disturb_the_stream_state() -> None:
    parser = HermesParser()
    parser.feed("<tool_call>")
    assert _calls(parser.parse(DUBLIN)) == [("get_weather", '{"city": "Dublin"}')]
    rest = parser.feed(DUBLIN[len("<tool_call>"):])
    assert _calls(rest) == [("get_weather", '{"city": "Dublin"}')] and rest.deltas[0].index == 0

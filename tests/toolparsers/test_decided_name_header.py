"""A constrained call's header goes out once its name is decided (`ToolParser(constrained=True)`):
hermes and llama3_json send index, id and name as soon as `{"name": "NAME"` is written, before the
arguments begin, and the deltas still join to parse()'s calls at every split; in parse-only mode
(`constrained` False) the header waits for the arguments' "{" as before. A constrained output cut
between the name and the arguments keeps its streamed call (auto) or drops it (forced, `cut`)."""

from __future__ import annotations

import pytest

from toolparsers import ToolSpec, get_tool_parser

WEATHER = ToolSpec("get_weather", parameters={"type": "object", "properties": {"city": {"type": "string"}}})
# each parser's call as its grammar writes it (toolparsers/call_format.py)
CALLS = {
    "hermes": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
}
NAMED = {"hermes": 'Let me check.\n<tool_call>\n{"name": "get_weather"', "llama3_json": '{"name": "get_weather"'}
ARGS_BEGUN = {name: text.index('{"city"') + 1 for name, text in CALLS.items()}


def header_at(name: str, constrained: bool) -> int:
    """Characters fed (one at a time) when the call's header delta came out."""
    parser = get_tool_parser(name)([WEATHER], constrained=constrained)
    for fed, char in enumerate(CALLS[name], start=1):
        if any(delta.id is not None for delta in parser.feed(char).deltas):
            return fed
    raise AssertionError("no header while feeding")


@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_header_goes_out_when_a_constrained_name_closes(name: str) -> None:
    assert header_at(name, constrained=True) == len(NAMED[name])
    assert header_at(name, constrained=False) == ARGS_BEGUN[name]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_constrained_deltas_join_to_the_parsed_call_at_every_split(name: str) -> None:
    text = CALLS[name]
    whole = get_tool_parser(name)([WEATHER], constrained=True).parse(text)
    assert [(c.name, c.arguments) for c in whole.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    for cut in range(len(text) + 1):
        parser = get_tool_parser(name)([WEATHER], constrained=True)
        first, rest = parser.feed(text[:cut]), parser.feed(text[cut:])
        first.extend(rest)
        first.extend(parser.finish())
        assert first.content == whole.content
        headers = [d for d in first.deltas if d.id is not None]
        assert [(d.index, d.name) for d in headers] == [(0, "get_weather")]
        assert "".join(d.arguments_delta for d in first.deltas) == whole.tool_calls[0].arguments
        assert [c.id for c in first.tool_calls] == [headers[0].id]


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_cut_after_its_name(name: str) -> None:
    cut_text = NAMED[name] + ', "argu'
    parser = get_tool_parser(name)([WEATHER], constrained=True)
    streamed = parser.feed(cut_text)
    (header,) = streamed.deltas
    kept = parser.finish()              # "auto": the streamed call stays a call, cut
    assert [c.name for c in kept.tool_calls] == ["get_weather"] and kept.tool_calls[0].id == header.id
    assert kept.cut_call_ids == {header.id} and "tool_call" not in kept.content and "name" not in kept.content
    assert kept.tool_calls[0].arguments == ', "argu'
    forced = get_tool_parser(name)([WEATHER], constrained=True)
    forced.feed(cut_text)
    dropped = forced.finish(cut=True)   # forced tool_choice: dropped, never content
    assert not dropped.tool_calls and "name" not in dropped.content


def test_other_spellings_wait_for_the_arguments() -> None:
    """Only the grammar's own `{"name": ` is read early: `{ "name": ...` may be auto free text."""
    parser = get_tool_parser("llama3_json")([WEATHER], constrained=True)
    assert not parser.feed('{ "name": "get_weather", ').deltas
    assert [d.name for d in parser.feed('"parameters": {').deltas if d.id is not None] == ["get_weather"]


# One engine output of a forced call in the fixed layout: the prefill's forced start, the name's
# first sampled token, then the jump-forward through the first required key
# (tests/toolparsers/test_forced_arguments_start.py).
HEADER_STEP = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city":',
    "llama3_json": '{"name": "get_weather", "parameters": {"city":',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city":',
}


@pytest.mark.parametrize("name", sorted(HEADER_STEP))
@pytest.mark.parametrize("constrained", [True, False])
def test_the_forced_arguments_start_streams_with_the_header(name: str, constrained: bool) -> None:
    """The output that writes the name and the forced `{"city":` gives the header and that fragment
    at once (nothing of it is held back: every character up to the colon is final JSON); the next
    output's text streams on."""
    parser = get_tool_parser(name)([WEATHER], constrained=constrained)
    deltas = parser.feed(HEADER_STEP[name]).deltas
    assert [(d.index, d.name, d.arguments_delta) for d in deltas] == [(0, "get_weather", ""), (0, None, '{"city":')]
    assert deltas[0].id is not None and deltas[1].id is None
    assert [d.arguments_delta for d in parser.feed(' "Par').deltas] == [' "Par']

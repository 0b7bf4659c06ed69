"""Outputs cut by max_tokens (`finish(cut=True)`): whatever call the limit cut off is dropped, never
returned as content with its markers; complete calls before it are kept; streaming agrees with parse."""

from __future__ import annotations

import pytest

from toolparsers import ToolSpec, get_tool_parser

WEATHER = ToolSpec(
    "get_weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)

# parser -> (an output with text and two calls, substrings that belong to calls only)
OUTPUTS = {
    "hermes": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Dublin"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Cork"}}\n</tool_call>',
        ["<tool", '{"name"', "Dublin", "Cork"],
    ),
    "llama3_json": (
        '{"name": "get_weather", "parameters": {"city": "Dublin"}}; '
        '{"name": "get_weather", "parameters": {"city": "Cork"}}',
        ['{"n', "Dublin", "Cork"],
    ),
    "mistral": (
        'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Dublin"}}, '
        '{"name": "get_weather", "arguments": {"city": "Cork"}}]',
        ["[TOOL", '{"name"', "Dublin", "Cork"],
    ),
    "pythonic": (
        '[get_weather(city="Dublin"), get_weather(city="Cork")]',
        ["get_weather(", "Dublin", "Cork"],
    ),
    "qwen3_coder": (
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nDublin\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nCork\n</parameter>\n</function>\n"
        "</tool_call>",
        ["<tool", "<function", "Dublin", "Cork"],
    ),
}


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_cut_off_calls_never_reach_content(name: str) -> None:
    text, call_only = OUTPUTS[name]
    parser = get_tool_parser(name)([WEATHER])
    full = [(c.name, c.arguments) for c in parser.parse(text).tool_calls]
    assert len(full) == 2
    saw_partial_drop = False
    for k in range(len(text) + 1):
        prefix = text[:k]
        whole = parser.parse(prefix, cut=True)
        calls = [(c.name, c.arguments) for c in whole.tool_calls]
        assert calls == full[: len(calls)], (k, calls)
        assert not any(s in whole.content for s in call_only), (k, whole.content)
        saw_partial_drop |= parser.parse(prefix).content != whole.content
        stream = get_tool_parser(name)([WEATHER])
        pieces = [stream.feed(prefix[: k // 2]), stream.feed(prefix[k // 2:]), stream.finish(cut=True)]
        assert "".join(p.content for p in pieces) == whole.content
        assert [(c.name, c.arguments) for p in pieces for c in p.tool_calls] == calls
    assert saw_partial_drop, "some prefix differs from the uncut parse (the cut-off call was dropped)"

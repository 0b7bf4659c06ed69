"""Qwen3CoderParser: XML parameters, values converted by the tools' schemas."""

from __future__ import annotations

import json

from toolparsers.base import ParseResult, ToolSpec
from toolparsers.qwen3_coder import Qwen3CoderParser

TOOL = ToolSpec(
    "run",
    parameters={
        "type": "object",
        "properties": {
            "code": {"type": "string"},
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "dry": {"type": "boolean"},
            "tags": {"type": "array"},
            "opts": {"type": ["object", "null"]},
        },
    },
)


def _block(params: str, name: str = "run") -> str:
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _param(key: str, value: str) -> str:
    return f"<parameter={key}>\n{value}\n</parameter>\n"


def _calls(result: ParseResult) -> list[tuple[str, str]]:
    return [(call.name, call.arguments) for call in result.tool_calls]


def test_values_converted_by_schema() -> None:
    text = _block(
        _param("code", "print('ü')\n  x = 1")
        + _param("count", "3")
        + _param("ratio", "0.5")
        + _param("dry", "True")
        + _param("tags", "['a', 'b']")
        + _param("opts", "null")
        + _param("extra", "42")
    )
    result = Qwen3CoderParser([TOOL]).parse("Running it." + text)
    assert result.content == "Running it."
    assert json.loads(result.tool_calls[0].arguments) == {
        "code": "print('ü')\n  x = 1", "count": 3, "ratio": 0.5, "dry": True,
        "tags": ["a", "b"], "opts": None, "extra": "42",
    }


def test_without_tools_values_stay_strings_and_bad_values_too() -> None:
    text = _block(_param("count", "3"))
    assert _calls(Qwen3CoderParser().parse(text)) == [("run", '{"count": "3"}')]
    assert _calls(Qwen3CoderParser([TOOL]).parse(_block(_param("count", "three")))) == [
        ("run", '{"count": "three"}')
    ]


def test_several_calls_and_no_parameters() -> None:
    text = _block(_param("count", "1")) + "\n" + _block("", name="stop")
    assert _calls(Qwen3CoderParser([TOOL]).parse(text)) == [("run", '{"count": 1}'), ("stop", "{}")]


def test_malformed_block_is_content() -> None:
    inners = ("<function=run>\nstray text\n</function>", "no function tag")
    for inner in inners:
        text = f"<tool_call>{inner}</tool_call>"
        result = Qwen3CoderParser([TOOL]).parse(text)
        assert result.content == text and result.tool_calls == []


def test_malformed_block_after_a_streamed_header_keeps_the_models_text() -> None:
    """`<function=run><parameter=` streamed a header: the call stays, its arguments end verbatim."""
    for inner, arguments in (
        ("<function=run><parameter=a>x", "{<parameter=a>x</tool_call>"),
        ("<function=run><parameter=a>x</parameter>junk</function>", '{"a": "x"junk</function>'),
    ):
        result = Qwen3CoderParser().parse(f"<tool_call>{inner}</tool_call>")
        assert [(c.name, c.arguments) for c in result.tool_calls] == [("run", arguments)] and not result.content


def test_end_marker_inside_a_value() -> None:
    text = _block(_param("code", "s = '</tool_call>'"))
    arguments = Qwen3CoderParser([TOOL]).parse(text).tool_calls[0].arguments
    assert json.loads(arguments) == {"code": "s = '</tool_call>'"}

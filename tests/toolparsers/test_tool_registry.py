"""TOOL_PARSERS registry (STYLE §5): every entry imports and is a ToolParser; unknown names list the known."""

from __future__ import annotations

import pytest

from toolparsers import TOOL_PARSERS, ToolParser, UnknownToolParser, get_tool_parser, new_call_id


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_every_entry_imports(name: str) -> None:
    parser_class = get_tool_parser(name)
    assert issubclass(parser_class, ToolParser)
    assert parser_class.name == name
    assert parser_class().parse("plain text").content == "plain text"


def test_unknown_parser_lists_the_names() -> None:
    with pytest.raises(UnknownToolParser) as info:
        get_tool_parser("hermes2")
    assert all(name in str(info.value) for name in TOOL_PARSERS)
    assert isinstance(info.value, ValueError)


def test_call_ids() -> None:
    ids = {new_call_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(i.startswith("call_") and len(i) == 29 and i[5:].isalnum() for i in ids)

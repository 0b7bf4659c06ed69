"""Arguments stream as generated (issue 14 item 1): every parser, one call with a long string argument
fed at every character and at every token of SmolLM2's tokenization, equals parse() of the whole; the
header goes out long before the call is complete; every prefix a client sees parses as partial JSON.
Also `JsonObjectPrefix` against json.loads and partial-json-parser."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from partial_json_parser import Allow
from partial_json_parser import loads as partial_loads

from toolparsers import ParseResult, ToolSpec, get_tool_parser
from toolparsers.json_prefix import JsonObjectPrefix

WRITE = ToolSpec(
    "write_file",
    parameters={"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}},
)
TEXT = 'def f(x):\n    return "{[(x)]}" + \'q\'  # Zürich 🌞 \u2603\n' * 3
ARGS = json.dumps({"path": "a.py", "text": TEXT})   # ASCII escapes: \n, \", \u00fc, \ud83c\udf1e
CALLS = {
    "hermes": f'Writing it.\n<tool_call>\n{{"name": "write_file", "arguments": {ARGS}}}\n</tool_call>',
    "llama3_json": f'<|python_tag|>{{"name": "write_file", "parameters": {ARGS}}}',
    "mistral": f'[TOOL_CALLS][{{"name": "write_file", "arguments": {ARGS}}}]',
    "pythonic": f"Writing it. [write_file(path='a.py', text={TEXT!r})]",
    "qwen3_coder": f"Writing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\na.py\n</parameter>\n"
    f"<parameter=text>\n{TEXT}\n</parameter>\n</function>\n</tool_call>",
}


def _run(name: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]], list[int]]:
    """Content, the calls reassembled from deltas, and for each argument fragment the number of
    characters fed when it came out; also checks each streamed prefix parses as partial JSON."""
    parser = get_tool_parser(name)([WRITE])
    content, names, arguments, fed_at = "", {}, {}, []
    fed = 0
    results: list[ParseResult] = []
    for piece in pieces:
        fed += len(piece)
        results.append(parser.feed(piece))
        fed_at.extend(fed for delta in results[-1].deltas if delta.arguments_delta)
    results.append(parser.finish())
    for result in results:
        content += result.content
        for delta in result.deltas:
            if delta.name is not None:
                names[delta.index], arguments[delta.index] = delta.name, ""
            arguments[delta.index] += delta.arguments_delta
            if delta.arguments_delta and not result.tool_calls:
                assert isinstance(partial_loads(arguments[delta.index], Allow.ALL), dict)
    return content, [(names[i], arguments[i]) for i in sorted(names)], fed_at


def _token_pieces(tokenizer, text: str) -> list[str]:
    """`text` as the detokenizer streams it: one piece per token, a piece held while it ends in an
    incomplete UTF-8 character."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces, sent = [], ""
    for k in range(1, len(ids) + 1):
        decoded = tokenizer.decode(ids[:k])
        if decoded.endswith("\ufffd"):
            continue
        pieces.append(decoded[len(sent):])
        sent = decoded
    assert sent == text
    return pieces


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_long_argument_streams_at_every_character_and_token(name: str, smollm2_tokenizer) -> None:
    text = CALLS[name]
    whole = get_tool_parser(name)([WRITE]).parse(text)
    expected = (whole.content, [(c.name, c.arguments) for c in whole.tool_calls])
    assert json.loads(whole.tool_calls[0].arguments) == {"path": "a.py", "text": TEXT}
    for pieces in (list(text), _token_pieces(smollm2_tokenizer, text)):
        content, calls, fed_at = _run(name, pieces)
        assert (content, calls) == expected
        # fragments went out while the call was being written, not only at its end
        assert len(fed_at) > 1 and fed_at[0] < len(text) * 0.8
        if name in ("hermes", "llama3_json", "mistral"):   # the model's JSON streams as written
            assert len(fed_at) > 20


@pytest.mark.parametrize("name", sorted(CALLS))
def test_header_goes_out_before_the_arguments_are_complete(name: str) -> None:
    text = CALLS[name]
    parser = get_tool_parser(name)([WRITE])
    cut = text.index("a.py") + 2   # inside the first argument
    first = parser.feed(text[:cut])
    header = [d for d in first.deltas if d.name is not None]
    if name in ("pythonic", "qwen3_coder"):   # the name and the first argument's start are written
        assert [d.name for d in header] == ["write_file"]
    else:
        assert [d.name for d in header] == ["write_file"] and first.deltas[-1].arguments_delta
    assert first.tool_calls == []


JSON_TEXTS = ['{"a": 1}', '{"s": "x\\u00e9\\ud83d\\ude00\\n", "l": [1, -2.5e3, true, null, {}]}', "{ }",
              '{"a": }', '{"a": 01}', '{"a": tru}', '{"a" 1}', '{"a": "x\ny"}', '{"a": [1,]}', '{"a": 1}}']


@pytest.mark.parametrize("text", JSON_TEXTS)
def test_json_prefix_agrees_with_json_and_partial_json(text: str) -> None:
    try:
        json.loads(text)
        valid = True
    except ValueError:
        valid = False
    for size in range(len(text) + 1):
        whole = JsonObjectPrefix(0)
        whole.advance(text[:size])
        grown = JsonObjectPrefix(0)
        for k in range(size + 1):
            grown.advance(text[:k])
        assert (grown.safe_end, grown.end, grown.failed) == (whole.safe_end, whole.end, whole.failed)
        if whole.safe_end:
            assert isinstance(partial_loads(text[:whole.safe_end], Allow.ALL), dict)
    reader = JsonObjectPrefix(0)
    reader.advance(text)
    assert (reader.end >= 0 and text[reader.end:] == "") == valid


@settings(max_examples=200, deadline=None)
@given(value=st.dictionaries(st.text(max_size=5), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8), max_size=4), ascii_only=st.booleans())
def test_json_prefix_reads_every_serialised_object(value: dict, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    reader = JsonObjectPrefix(0)
    for k in range(0, len(text) + 1, 3):
        reader.advance(text[:k])
        assert not reader.failed
        if reader.safe_end:
            partial_loads(text[:reader.safe_end], Allow.ALL)
    reader.advance(text)
    assert reader.end == len(text) and reader.safe_end == len(text)

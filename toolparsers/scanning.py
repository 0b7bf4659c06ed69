"""Text scanning shared by the parsers: partial markers, JSON members, tagged blocks."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from toolparsers.base import Call, Segment, Text
from toolparsers.brackets import Memo, find_closing, find_outside_json_strings
from toolparsers.json_prefix import JsonObjectPrefix

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"
# `{"name": "NAME", "arguments": {` (or "parameters"; Llama 3.2's `"type": "function", ` may come
# first): a JSON call whose name is known and whose arguments object has begun, so it can stream
# (the lookahead stops at the arguments' "{").
_JSON_CALL_HEADER = re.compile(
    r'\{[ \t\n\r]*(?:"type"[ \t\n\r]*:[ \t\n\r]*"function"[ \t\n\r]*,[ \t\n\r]*)?'
    r'"name"[ \t\n\r]*:[ \t\n\r]*("(?:[^"\\\x00-\x1f]|\\.)*")[ \t\n\r]*,[ \t\n\r]*'
    r'"(?:arguments|parameters)"[ \t\n\r]*:[ \t\n\r]*(?=\{)'
)

# `{"name": "NAME"` exactly as the call grammars write it (the llama3_json trigger; hermes after
# `<tool_call>\n`): a call object whose name string is closed. Under a grammar that constrains the
# call, the name is then decided (it can only be one of the request's tools), before the arguments;
# other spellings (`{ "name"`, `"type": "function"` first) are not what the grammar writes, so in
# "auto" they may be free text and are not read early.
_JSON_CALL_NAME = re.compile(r'\{"name": ("(?:[^"\\\x00-\x1f]|\\.)*")')


def skip_ws(text: str, pos: int) -> int:
    """Index of the first character at or after `pos` that is not JSON whitespace (`len(text)` if none)."""
    while pos < len(text) and text[pos] in _WS:
        pos += 1
    return pos


def match_end(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """End of `pattern`'s match at `pos` (`pos` itself when it does not match)."""
    match = pattern.match(text, pos)
    return match.end() if match else pos


def partial_marker_len(text: str, markers: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers` (0 if none)."""
    best = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:size]):
                best = size
                break
    return best


def json_block_end(text: str, pos: int, end: str, memo: Memo | None = None) -> int | None:
    """For a block whose inner text starts at `pos` with a JSON object: the index of the first `end`
    outside JSON strings (so `end` may appear inside argument strings), -1 if none yet; None when the
    inner text does not start with "{" (the caller then uses its plain rule). `memo`: see brackets.py."""
    first = skip_ws(text, pos)
    if first == len(text):
        return -1
    if text[first] != "{":
        return None
    return find_outside_json_strings(text, first, end, memo)


def json_members(text: str) -> list[tuple[str, Any, str]] | None:
    """The members of the JSON object `text` (surrounding whitespace allowed) as (key, value, raw value
    text) in order, or None when `text` is not exactly one JSON object."""
    try:
        i = skip_ws(text, 0)
        if text[i] != "{":
            return None
        i = skip_ws(text, i + 1)
        members: list[tuple[str, Any, str]] = []
        if text[i] == "}":
            i += 1
        else:
            while True:
                if text[i] != '"':
                    return None
                key, i = scanstring(text, i + 1)
                i = skip_ws(text, i)
                if text[i] != ":":
                    return None
                i = skip_ws(text, i + 1)
                value, end = _DECODER.raw_decode(text, i)
                members.append((key, value, text[i:end]))
                i = skip_ws(text, end)
                if text[i] == "}":
                    i += 1
                    break
                if text[i] != ",":
                    return None
                i = skip_ws(text, i + 1)
    except (IndexError, ValueError):
        return None
    return members if text[i:].strip(_WS) == "" else None


def arguments_text(value: Any, raw: str | None) -> str | None:
    """Canonical arguments for a parsed `arguments` value: the model's own JSON text of the object
    (stripped), the decoded text when the model wrote the object as a JSON string, "{}" when absent
    (`value` None); None when the value is not an object."""
    if value is None and raw in (None, "null"):
        return "{}"
    if isinstance(value, dict) and raw is not None:
        return raw.strip()
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return None
        return value.strip() if isinstance(decoded, dict) else None
    return None


def call_from_members(
    members: list[tuple[str, Any, str]] | None, argument_keys: tuple[str, ...]
) -> Call | None:
    """A `Call` from JSON members `{"name": str, <one of argument_keys>: object}`, or None.

    Other keys ("type", "id", ...) are ignored; a missing arguments key means "{}".
    """
    if members is None:
        return None
    found = {key: (value, raw) for key, value, raw in members}
    name = found.get("name", (None, None))[0]
    if not isinstance(name, str) or not name.strip():
        return None
    args_key = next((key for key in argument_keys if key in found), None)
    value, raw = found[args_key] if args_key else (None, None)
    arguments = arguments_text(value, raw)
    return Call(name.strip(), arguments) if arguments is not None else None


def json_call_header(text: str, pos: int) -> tuple[str, int] | None:
    """For a call object at `text[pos]` that starts `{"name": "NAME", "arguments": {` ("parameters"
    also, `"type": "function"` first also): (the stripped NAME, index of the arguments' "{"); None
    when it does not (yet) start so, or the name is empty or not a valid JSON string."""
    return _named_match(_JSON_CALL_HEADER, text, pos)


def _named_match(pattern: re.Pattern[str], text: str, pos: int) -> tuple[str, int] | None:
    """(the stripped JSON string of `pattern`'s group 1, end of the match) where `pattern` matches
    at `text[pos]`; None without a match, or when the name is empty or not a valid JSON string."""
    match = pattern.match(text, pos)
    if match is None:
        return None
    try:
        name = json.loads(match.group(1)).strip()
    except ValueError:
        return None
    return (name, match.end()) if name else None


def decided_call_name(text: str, pos: int) -> tuple[str, int] | None:
    """For a call object at `text[pos]` written `{"name": "NAME"` with its name string closed: (the
    stripped NAME, index past the name string); None otherwise. Only a grammar-constrained call may
    be read so early (its name can then be nothing else)."""
    return _named_match(_JSON_CALL_NAME, text, pos)


def cut_decided_call(text: str, pos: int, stop: int) -> Call | None:
    """A constrained call at `text[pos]` that the output ended inside, after its name and before its
    arguments began (its header may have streamed, `open_json_call` with `name_decides`): the
    call, its arguments the model's text after the name verbatim, `complete` False; None when its
    name is not closed either."""
    named = decided_call_name(text[:stop], pos)
    return Call(named[0], text[named[1]:stop], complete=False) if named is not None else None


def header_call_segments(text: str, pos: int, stop: int, header: tuple[str, int]) -> list[Segment]:
    """The decided segments of a JSON call `text[pos:stop]` whose header matched (`json_call_header`).

    The header decides: the call is `header`'s name with the model's text of the arguments object.
    Arguments that are not valid JSON (only unconstrained output) are the text the model wrote for
    them, verbatim: up to their closing bracket, or to `stop` when they never close
    (`Call.complete` False). When the whole call is not one JSON object, the text after the
    arguments that is more than closing brackets and whitespace is content.
    """
    name, args_start = header
    reader = JsonObjectPrefix(args_start)
    reader.advance(text[:stop])
    args_end = reader.end
    if args_end < 0:
        args_end = find_closing(text[:stop], args_start)
    if args_end < 0:
        return [Call(name, text[args_start:stop], complete=False)]
    segments: list[Segment] = [Call(name, text[args_start:args_end])]
    rest = text[args_end:stop]
    if rest.strip(_WS + "}]") and json_members(text[pos:stop]) is None:
        segments.append(Text(rest))
    return segments


def open_json_call(
    text: str, pos: int, reader_at: Callable[[int], JsonObjectPrefix], name_decides: bool = False
) -> OpenCallPrefix | None:
    """The streamable part of a JSON call starting at `text[pos]`: (name, arguments prefix, closed)
    once its header is written (`json_call_header`), else None. `reader_at(start)` gives the
    resumable JSON reader of the arguments at `start`, advanced over `text`.

    `name_decides` (a grammar constrains the call): the call opens as soon as its name string
    closes (`decided_call_name`), with an empty arguments prefix until the arguments begin."""
    header = json_call_header(text, pos)
    if header is None:
        named = decided_call_name(text, pos) if name_decides else None
        return (named[0], "", -1) if named is not None else None
    name, args_start = header
    reader = reader_at(args_start)
    return name, text[args_start:reader.safe_end], reader.end


OpenCallPrefix = tuple[str, str, int]
"""(name, streamable arguments prefix, index past the closed arguments or -1) of `open_json_call`."""


def scan_tagged(
    text: str,
    final: bool,
    start: str,
    end: str,
    parse_inner: Callable[[str], list[Segment] | None],
    find_end: Callable[[str, int], int | None] | None = None,
) -> tuple[list[Segment], int]:
    """Scan `text` for `start ... end` blocks (`ToolParser._scan` contract).

    `find_end(text, inner_start)` knows the format inside a block: it returns the index of the `end`
    that closes it (so `end` may appear inside strings), -1 while undecided, or None to fall back to
    the plain rule: the block runs from the last `start` before the first `end`. `parse_inner` turns the
    inner text into calls or returns None (the block is then content, verbatim). At the end of the
    output an unclosed block whose inner text parses is accepted (models often omit the end marker).
    """
    segments: list[Segment] = []
    pos = 0
    while True:
        begin = text.find(start, pos)
        if begin < 0:
            keep = 0 if final else partial_marker_len(text[pos:], [start])
            segments.append(Text(text[pos:len(text) - keep]))
            return segments, len(text) - keep
        segments.append(Text(text[pos:begin]))
        inner_begin = begin
        close = find_end(text, begin + len(start)) if find_end is not None else None
        if close is None:
            close = text.find(end, begin + len(start))
            inner_begin = text.rfind(start, begin, close) if close >= 0 else begin
        if close < 0:
            if not final:
                return segments, begin
            calls = parse_inner(text[begin + len(start):])
            segments.extend(calls if calls is not None else [Text(text[begin:])])
            return segments, len(text)
        segments.append(Text(text[begin:inner_begin]))
        calls = parse_inner(text[inner_begin + len(start):close])
        pos = close + len(end)
        segments.extend(calls if calls is not None else [Text(text[inner_begin:pos])])

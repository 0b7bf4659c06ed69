"""Text scanning shared by the parsers: partial markers, JSON members, tagged blocks."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from toolparsers.base import Call, Segment, Text
from toolparsers.brackets import Memo, find_outside_json_strings

_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


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


def scan_tagged(
    text: str,
    final: bool,
    start: str,
    end: str,
    parse_inner: Callable[[str], list[Call] | None],
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

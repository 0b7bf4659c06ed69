"""Resumable bracket matching over a growing text: JSON and Python sources, strings skipped.

Streaming rescans a held-back call on every delta; a `Memo` (owned by one parser's stream, cleared
whenever the buffer's front is consumed) keeps where each scan stopped, so a long call (say a
`write_file` argument of many kilobytes) costs linear time in total, not quadratic.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# (scan kind, start index) -> (index to resume at, bracket depth, open string delimiter or "")
Memo = dict[tuple[str, int], tuple[int, int, str]]

_SIGNIFICANT_JSON = re.compile(r'[\[\]{}()"]')
_SIGNIFICANT_PYTHON = re.compile(r"[\[\]{}()\"']")
_SIGNIFICANT_VALUE = re.compile(r"[\[\]{}()\"',]")
_STRING_STOP = {delim: re.compile(r"\\|" + re.escape(delim)) for delim in ('"', "'", '"""', "'''")}


def find_closing(text: str, start: int, python: bool = False, memo: Memo | None = None) -> int:
    """Index just past the bracket that closes the one at `text[start]`, or -1 if not closed yet.

    Any of `{[(` opens and `}])` closes (kinds are not checked: the caller's decoder validates).
    Strings are skipped: JSON double-quoted ones, and with `python` also single-quoted and
    triple-quoted ones, all with backslash escapes. With `memo`, a later call on a longer `text`
    (same prefix) resumes where this one stopped.
    """
    significant = _SIGNIFICANT_PYTHON if python else _SIGNIFICANT_JSON

    def step(char: str, depth: int, pos: int) -> tuple[int, int]:
        depth += 1 if char in "{[(" else -1
        return depth, (pos + 1 if depth == 0 else -1)

    return _walk(text, ("close", start), start, memo, significant, python, step)


def find_value_end(text: str, start: int, memo: Memo | None = None) -> int:
    """Index of the first "," or closing bracket at bracket depth 0 from `start` in a Python source,
    outside strings (the end of an argument value), or -1 if not written yet. `memo` as above."""

    def step(char: str, depth: int, pos: int) -> tuple[int, int]:
        if depth == 0 and char in ",)]}":
            return depth, pos
        return depth + (1 if char in "{[(" else (-1 if char in ")]}" else 0)), -1

    return _walk(text, ("value", start), start, memo, _SIGNIFICANT_VALUE, True, step)


def _walk(text: str, key: tuple[str, int], start: int, memo: Memo | None, significant: re.Pattern[str],
          python: bool, step: Callable[[str, int, int], tuple[int, int]]) -> int:
    """The scan both finders share: from `start` (or where `memo[key]` stopped), skip strings and
    hand every other `significant` character to `step(char, depth, pos) -> (depth, found)`; return
    the first `found` >= 0, or -1 at the end of `text` (remembering where it stopped in `memo`)."""
    pos, depth, delim = memo.get(key, (start, 0, "")) if memo is not None else (start, 0, "")
    while True:
        if delim:
            pos, closed = _skip_string(text, pos, delim)
            if not closed:
                break
            delim = ""
            continue
        match = significant.search(text, pos)
        if match is None:
            pos = len(text)
            break
        pos, char = match.start(), match.group()
        if char in "\"'":
            delim = _opening_quote(text, pos, python)
            if not delim:
                break
            pos += len(delim)
            continue
        depth, found = step(char, depth, pos)
        if found >= 0:
            return found
        pos += 1
    if memo is not None:
        memo[key] = (pos, depth, delim)
    return -1


def find_outside_json_strings(text: str, pos: int, end: str, memo: Memo | None = None) -> int:
    """Index of the first `end` at or after `pos` that is not inside a JSON string, -1 if none yet."""
    key = ("outside", pos)
    pos, _, delim = memo.get(key, (pos, 0, "")) if memo is not None else (pos, 0, "")
    pattern = re.compile('"|' + re.escape(end))
    while True:
        if delim:
            pos, closed = _skip_string(text, pos, delim)
            if not closed:
                break
            delim = ""
            continue
        match = pattern.search(text, pos)
        if match is None:
            pos = max(pos, len(text) - len(end) + 1)
            break
        if match.group() != '"':
            return match.start()
        pos, delim = match.end(), '"'
    if memo is not None:
        memo[key] = (pos, 0, delim)
    return -1


def _opening_quote(text: str, pos: int, python: bool) -> str:
    """The string delimiter that starts at `pos`; "" while the text ends before that is known."""
    char = text[pos]
    if not python:
        return char
    if text.startswith(char * 3, pos):
        return char * 3
    tail = text[pos:]
    return "" if len(tail) < 3 and tail == char * len(tail) else char


def _skip_string(text: str, pos: int, delim: str) -> tuple[int, bool]:
    """Scan a string body from `pos` for its closing `delim`: (index past it, True), or (index to
    resume at, False) when the text ends first."""
    stop = _STRING_STOP[delim]
    while True:
        match = stop.search(text, pos)
        if match is None:
            return max(pos, len(text) - len(delim) + 1), False
        if match.group() == "\\":
            pos = match.start() + 2
            continue
        return match.end(), True

"""Regex features a backend may not enforce: found by scanning the pattern text.

xgrammar's regex converter accepts lookaround groups (`(?=...)`, `(?!...)`, `(?<=...)`,
`(?<!...)`) and drops the assertion, so the compiled grammar accepts strings the pattern rejects.
The scan follows ECMA-262 regex syntax (the dialect of JSON Schema `pattern`, JSON Schema 2020-12
§6.3.3): a backslash escapes the next character, and `(` inside a character class is a literal.
"""

from __future__ import annotations

_LOOKAROUND_OPENERS = ("(?=", "(?!", "(?<=", "(?<!")


def find_lookaround(regex: str) -> int | None:
    """Index in `regex` of the first lookaround group opener, or None when there is none.

    Escaped parentheses (`\\(?=`) and parentheses inside character classes (`[(?=]`) are literals
    and do not count. Named groups (`(?<name>...)`) are not lookaround.
    """
    i, in_class = 0, False
    while i < len(regex):
        char = regex[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True  # ECMA-262: "[]" is an empty class, "[^]" any character
        elif char == "(" and regex.startswith(_LOOKAROUND_OPENERS, i):
            return i
        i += 1
    return None

"""Incremental check of a growing JSON object text: how much of it is a valid prefix that is safe to stream.

A tool call's arguments stream as the model writes them. `JsonObjectPrefix` reads the text from the
object's "{" on, resuming where it stopped (linear in total over a growing buffer), and keeps:

- `safe_end`: `text[start:safe_end]` is a prefix of some valid JSON object (RFC 8259) and ends at a
  safe cut: between tokens, or inside a string but never inside an escape (`\\n`, `\\uXXXX`, nor
  between the two `\\u` escapes of a surrogate pair), nor inside a number or literal still being
  written (`1` may become `12`; `tr` is not a value yet). A client that parses each streamed prefix
  with a partial-JSON parser (partial-json-parser, jiter's partial mode) therefore always succeeds.
- `end`: index just past the object's closing "}" once it is written (-1 before).
- `failed`: the text stopped being JSON at `safe_end`'s next token (never true when a grammar
  constrained the call).

Written for this project (no code taken from partial-json-parser, which re-parses the whole text on
every call and would make a long argument quadratic); tests compare it with partial-json-parser.
"""

from __future__ import annotations

import re

_WS = re.compile(r"[ \t\n\r]*")
_STRING_BODY = re.compile(r'[^"\\\x00-\x1f]*')
_NUMBER_CHARS = re.compile(r"[-+.eE0-9]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LOW_SURROGATE_PREFIX = re.compile(r"(?:\\(?:u(?:[dD](?:[c-fC-F][0-9a-fA-F]{0,2})?)?)?)?")
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "true", "f": "false", "n": "null"}

# What the reader expects next (outside strings).
_VALUE, _KEY_OR_CLOSE, _KEY, _COLON, _COMMA_OR_CLOSE, _VALUE_OR_CLOSE = range(6)


class JsonObjectPrefix:
    """Reads one JSON object starting at `text[start]` of a growing text (see the module docstring).

    Call `advance(text)` with the text so far (each call's text extends the previous one). The first
    character must be "{", else `failed` is set at once.
    """

    def __init__(self, start: int) -> None:
        self.start = start
        self.safe_end = start
        self.end = -1
        self.failed = False
        self._pos = start
        self._stack: list[str] = []      # open containers, "{" or "["
        self._expect = _VALUE
        self._in_string = False
        self._is_key = False
        self._token_start = start        # start of the escape / number / literal being read

    @property
    def done(self) -> bool:
        """The object is closed or the text stopped being JSON: more text changes nothing."""
        return self.end >= 0 or self.failed

    def advance(self, text: str) -> None:
        """Read `text` from where the last call stopped."""
        while not self.done and self._pos < len(text):
            before = self._pos, self._in_string
            if self._in_string:
                self._string(text)
            else:
                self._structure(text)
            if (self._pos, self._in_string) == before and not self.done:
                return  # an escape, number or literal still being written

    def _string(self, text: str) -> None:
        pos = _STRING_BODY.match(text, self._pos).end()
        self._pos = self.safe_end = pos
        if pos == len(text):
            return
        char = text[pos]
        if char == '"':
            self._pos = pos + 1
            self._in_string = False
            self._expect = _COLON if self._is_key else _COMMA_OR_CLOSE
            self.safe_end = self._pos
        elif char == "\\":
            self._escape(text, pos)
        else:  # a raw control character: JSON requires it escaped
            self.failed = True

    def _escape(self, text: str, pos: int) -> None:
        """The escape at `pos`; a high surrogate waits for its low half before the cut moves."""
        if pos + 1 >= len(text):
            return
        kind = text[pos + 1]
        if kind in _SIMPLE_ESCAPES:
            self._pos = self.safe_end = pos + 2
            return
        if kind != "u":
            self.failed = True
            return
        digits = text[pos + 2:pos + 6]
        if any(c not in _HEX for c in digits):
            self.failed = True
            return
        if len(digits) < 4:
            return
        code = int(digits, 16)
        if 0xD800 <= code <= 0xDBFF:    # keep the pair together: wait for "\\uDC00".."\\uDFFF"
            low = text[pos + 6:pos + 12]
            if _LOW_SURROGATE_PREFIX.fullmatch(low):
                if len(low) < 6:
                    return
                self._pos = self.safe_end = pos + 12
                return
        self._pos = self.safe_end = pos + 6

    def _structure(self, text: str) -> None:
        pos = _WS.match(text, self._pos).end()
        if pos > self._pos:   # whitespace between tokens: a safe cut (a value's first char opened it)
            self._pos = pos
            if self._stack:
                self.safe_end = pos
            return
        char = text[pos]
        expect = self._expect
        if expect in (_KEY_OR_CLOSE, _COMMA_OR_CLOSE, _VALUE_OR_CLOSE) and char in "}]":
            self._close(char)
        elif expect == _COMMA_OR_CLOSE and char == ",":
            self._step(pos + 1, _KEY if self._stack[-1] == "{" else _VALUE)
        elif expect in (_KEY_OR_CLOSE, _KEY) and char == '"':
            self._is_key = True
            self._in_string = True
            self._step(pos + 1, expect)
        elif expect == _COLON and char == ":":
            self._step(pos + 1, _VALUE)
        elif expect in (_VALUE, _VALUE_OR_CLOSE):
            self._value(text, pos)
        else:
            self.failed = True

    def _step(self, pos: int, expect: int) -> None:
        self._pos = self.safe_end = pos
        self._expect = expect

    def _close(self, char: str) -> None:
        if (char == "}") != (self._stack[-1] == "{"):
            self.failed = True
            return
        self._stack.pop()
        self._step(self._pos + 1, _COMMA_OR_CLOSE)
        if not self._stack:
            self.end = self._pos

    def _value(self, text: str, pos: int) -> None:
        char = text[pos]
        if not self._stack and char != "{":
            self.failed = True
        elif char in "{[":
            self._stack.append(char)
            self._step(pos + 1, _KEY_OR_CLOSE if char == "{" else _VALUE_OR_CLOSE)
        elif char == '"':
            self._is_key = False
            self._in_string = True
            self._step(pos + 1, _COMMA_OR_CLOSE)
        elif char in _LITERALS:
            self._literal(text, pos, _LITERALS[char])
        elif char == "-" or char.isdigit():
            self._number(text, pos)
        else:
            self.failed = True

    def _literal(self, text: str, pos: int, word: str) -> None:
        written = text[pos:pos + len(word)]
        if not word.startswith(written):
            self.failed = True
        elif len(written) == len(word):
            self._step(pos + len(word), _COMMA_OR_CLOSE)

    def _number(self, text: str, pos: int) -> None:
        end = _NUMBER_CHARS.match(text, pos).end()
        if end == len(text):
            return  # the number may go on: wait for the character after it
        if _NUMBER.fullmatch(text, pos, end) is None:
            self.failed = True
        else:
            self._step(end, _COMMA_OR_CLOSE)

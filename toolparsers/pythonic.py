"""Pythonic tool calls (Llama 3.2/4, ToolACE): a Python list of calls with keyword literal arguments.

    [get_weather(city="Dublin", days=3), get_time()]

Follows vLLM's `pythonic` parser, but the list may appear anywhere in the text (text before and
after stays content). It is parsed with `ast`: keyword arguments only, values Python literals
(`ast.literal_eval`), which become `json.dumps(values, ensure_ascii=False)` (tuples become lists;
sets, bytes, NaN make the list content). `<|python_start|>` / `<|python_end|>` are dropped.

Streaming (toolparsers/base.py): a call's header goes out once `[name(key=` (or `[name()`) is
written; its arguments stream as the JSON built one keyword argument at a time (`{`, then
`"key": value` as each value is complete, then `}`). A call that turns out malformed after its
header keeps the JSON of the arguments read so far followed by the model's remaining source of the
call verbatim (not valid JSON); the rest of the list after a well-formed call is content.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

from constrained.errors import NotComposable
from constrained.spec import GrammarSpec
from constrained.structural_tag import StructuralTagGrammar
from toolparsers.base import Call, OpenCall, Segment, Text, ToolChoice, ToolParser, ToolSpec
from toolparsers.brackets import Memo, find_closing, find_value_end
from toolparsers.call_format import NAME, CallFormat
from toolparsers.errors import UnsupportedTool
from toolparsers.pythonic_grammar import pythonic_grammar
from toolparsers.scanning import partial_marker_len, skip_ws
from toolparsers.tool_grammar import resolve_tool_choice, single_call

MARKERS = ["<|python_start|>", "<|python_end|>"]
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CALL_OPEN = re.compile(r"[ \t\n\r]*([A-Za-z_][A-Za-z0-9_]*)[ \t\n\r]*\(")
_KWARG = re.compile(r"[ \t\n\r]*([A-Za-z_][A-Za-z0-9_]*)[ \t\n\r]*=(?!=)")
_PARTIAL_KWARG = re.compile(r"[ \t\n\r]*(?:[A-Za-z_][A-Za-z0-9_]*[ \t\n\r]*)?")
_CLOSE_PAREN = re.compile(r"[ \t\n\r]*\)")

StartState = Literal["yes", "maybe", "no"]


class PythonicParser(ToolParser):
    """`[f(a=1), g()]` call lists parsed with `ast` (vLLM name: pythonic)."""

    name = "pythonic"
    # A call alone is `[NAME(kw=literal, ...)]`; several share one list, joined by ", " inside it.
    # The arguments are Python keyword literals, not JSON, so grammar_for writes xgrammar EBNF.
    call_format = CallFormat(f"[{NAME}(", ")]", "[", ", ")

    def _scan(self, text: str, final: bool) -> tuple[list[Segment], int]:
        segments: list[Segment] = []
        pos = 0
        while True:
            start, kind = _next_start(text, pos, final)
            if start < 0:
                keep = 0 if final else partial_marker_len(text[pos:], MARKERS)
                segments.append(Text(text[pos:len(text) - keep]))
                return segments, len(text) - keep
            segments.append(Text(text[pos:start]))
            if kind == "maybe":
                return segments, start
            if kind != "list":
                pos = start + len(kind)
                continue
            end = find_closing(text, start, python=True, memo=self._memo)
            if end < 0 and not final:
                return segments, start
            stop = end if end >= 0 else len(text)
            calls = _parse_calls(text[start:stop]) if end >= 0 else None
            if calls is None:
                calls = _streamed_segments(text[start:stop], closed=end >= 0)
            segments.extend(calls if calls is not None else [Text(text[start:stop])])
            if end < 0:
                return segments, len(text)
            pos = end

    def _open_calls(self, text: str) -> list[OpenCall]:
        if not text.startswith("["):
            return []
        calls, _ = _read_calls(text, self._memo)
        return [OpenCall(call.name, call.arguments()) for call in calls]

    def grammar_for(
        self, tools: list[ToolSpec], tool_choice: ToolChoice, parallel_tool_calls: bool = True
    ) -> GrammarSpec | None:
        """`GrammarKind.GRAMMAR` in xgrammar EBNF (backend pinned to "xgrammar"): forced, the output is
        one call list; auto, either a call list or text that does not start with "[".

        Raises UnsupportedTool when a tool name is not a Python identifier.
        """
        allowed, forced = resolve_tool_choice(tools, tool_choice)
        if not allowed:
            return None
        for tool in allowed:
            if not tool.name.isidentifier() or keyword.iskeyword(tool.name):
                raise UnsupportedTool(
                    f"tool name {tool.name!r} is not a Python identifier, so the pythonic call format "
                    "cannot express it",
                    param="tools",
                )
        return pythonic_grammar(allowed, forced=forced, single=single_call(tool_choice, parallel_tool_calls))

    def call_grammar(
        self, tools: list[ToolSpec], tool_choice: ToolChoice, parallel_tool_calls: bool = True
    ) -> StructuralTagGrammar | None:
        """Never: a call list of Python literals is no structural tag, so it cannot be joined with a
        JSON answer. None where `grammar_for` is None; raises what `grammar_for` raises, else
        NotComposable (part "calls")."""
        if self.grammar_for(tools, tool_choice, parallel_tool_calls) is None:
            return None
        raise NotComposable("pythonic tool calls cannot be combined with a JSON answer; only calls written "
                            "as structural tags can", part="calls", param="pythonic")


def _next_start(text: str, pos: int, final: bool) -> tuple[int, str]:
    """Next call-list "[" ("list"), undecided "[" ("maybe") or marker (the marker text) at or after `pos`."""
    hits = [(at, marker) for marker in MARKERS if (at := text.find(marker, pos)) >= 0]
    marker_at, marker = min(hits) if hits else (-1, "")
    bracket = text.find("[", pos)
    while bracket >= 0 and (marker_at < 0 or bracket < marker_at):
        state = _start_state(text, bracket)
        if state == "yes":
            return bracket, "list"
        if state == "maybe" and not final:
            return bracket, "maybe"
        bracket = text.find("[", bracket + 1)
    return marker_at, marker


def _start_state(text: str, bracket: int) -> StartState:
    """Whether the "[" at `bracket` opens a call list: `[` name `(` ("maybe" when the text ends first)."""
    j = skip_ws(text, bracket + 1)
    if j == len(text):
        return "maybe"
    ident = _IDENT.match(text, j)
    if ident is None:
        return "no"
    k = skip_ws(text, ident.end())
    if k == len(text):
        return "maybe"
    return "yes" if text[k] == "(" else "no"


@dataclass(slots=True)
class _ReadCall:
    """A call of a list read so far: its name, the JSON members of its complete keyword arguments,
    `end` (index past its ")" once closed) and `broken_at` (where its source stopped being a
    literal-only call; -1 while it is not known to be broken)."""

    name: str
    members: list[str] = field(default_factory=list)
    end: int = -1
    broken_at: int = -1

    def arguments(self, rest: str = "") -> str:
        """The JSON text of the arguments read (closed once the call is), then `rest` verbatim."""
        return "{" + ", ".join(self.members) + ("}" if self.end >= 0 else rest)


def _read_calls(source: str, memo: Memo | None) -> tuple[list[_ReadCall], int]:
    """The calls of the list `source` ("[" ...) whose header is written (`name(key=` or `name()`),
    in order, while the list is well formed, and the index where reading stopped."""
    calls: list[_ReadCall] = []
    pos = 1
    while (opened := _CALL_OPEN.match(source, pos)) is not None:
        if _KWARG.match(source, opened.end()) is None and _CLOSE_PAREN.match(source, opened.end()) is None:
            return calls, opened.start()   # no header yet (or a positional argument: not a call)
        call = _ReadCall(opened.group(1))
        pos = _read_arguments(source, opened.end(), call, memo)
        calls.append(call)
        if call.end < 0:
            return calls, pos
        after = skip_ws(source, call.end)
        if not source.startswith(",", after):
            return calls, call.end
        pos = after + 1
    return calls, pos


def _read_arguments(source: str, pos: int, call: _ReadCall, memo: Memo | None) -> int:
    """Read the keyword arguments of `call` from `pos` (just past its "("); returns where it stopped
    (at the "," before an argument it could not read, so a broken rest starts there)."""
    while True:
        at = pos + 1 if call.members else pos   # past the "," that ended the previous value
        close = _CLOSE_PAREN.match(source, pos) or (_CLOSE_PAREN.match(source, at) if call.members else None)
        if close is not None:
            call.end = close.end()
            return call.end
        kwarg = _KWARG.match(source, at)
        if kwarg is None:
            if _PARTIAL_KWARG.fullmatch(source, at) is None:
                call.broken_at = pos
            return pos
        value_end = find_value_end(source, kwarg.end(), memo)
        if value_end < 0:
            return pos
        member = _member(kwarg.group(1), source[kwarg.end():value_end])
        if member is None or source[value_end] not in ",)":
            call.broken_at = pos
            return pos
        call.members.append(member)
        pos = value_end


def _member(key: str, value_source: str) -> str | None:
    """`"key": <JSON of the literal>` or None when `value_source` is not a JSON-able literal."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = ast.literal_eval(value_source.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return _json_member(key, value)


def _json_member(key: str, value: Any) -> str | None:
    try:
        value_json = json.dumps(value, ensure_ascii=False, allow_nan=False)
        return json.dumps(key, ensure_ascii=False) + ": " + value_json
    except (TypeError, ValueError):
        return None


def _streamed_segments(source: str, closed: bool) -> list[Segment] | None:
    """A malformed (or unfinished) list whose calls streamed: those calls, the last broken one with
    the model's remaining source verbatim; text after the last closed call is content; None when no
    call streamed."""
    calls, stop = _read_calls(source, None)
    if not calls:
        return None
    body_end = len(source) - 1 if closed else len(source)
    segments: list[Segment] = []
    for call in calls:
        if call.end >= 0:
            segments.append(Call(call.name, call.arguments()))
        else:
            rest = source[stop:body_end]
            segments.append(Call(call.name, call.arguments(rest), complete=False))
            return segments
    rest = source[stop:body_end]
    if rest.strip(" \t\n\r,"):
        segments.append(Text(rest))
    return segments


def _parse_calls(source: str) -> list[Call] | None:
    """The calls of a `[f(a=1), ...]` source text, or None when it is not a list of literal-only calls."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            body = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not isinstance(body, ast.List) or not body.elts:
        return None
    calls = []
    for node in body.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        members = []
        for kwarg in node.keywords:
            if kwarg.arg is None:
                return None
            try:
                member = _json_member(kwarg.arg, ast.literal_eval(kwarg.value))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
            if member is None:
                return None
            members.append(member)
        calls.append(Call(node.func.id, "{" + ", ".join(members) + "}"))
    return calls

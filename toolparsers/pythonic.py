"""Pythonic tool calls (Llama 3.2/4, ToolACE): a Python list of calls with keyword literal arguments.

    [get_weather(city="Dublin", days=3), get_time()]

Follows vLLM's `pythonic` parser, but the list may appear anywhere in the text (text before and
after stays content). It is parsed with `ast`: keyword arguments only, values Python literals
(`ast.literal_eval`), which become `json.dumps(values, ensure_ascii=False)` (tuples become lists;
sets, bytes, NaN make the list content). `<|python_start|>` / `<|python_end|>` are dropped.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
import warnings
from typing import Literal

from constrained.errors import NotComposable
from constrained.spec import GrammarSpec
from constrained.structural_tag import StructuralTagGrammar
from toolparsers.base import Call, Segment, Text, ToolChoice, ToolParser, ToolSpec
from toolparsers.brackets import find_closing
from toolparsers.call_format import NAME, CallFormat
from toolparsers.errors import UnsupportedTool
from toolparsers.pythonic_grammar import pythonic_grammar
from toolparsers.scanning import partial_marker_len, skip_ws
from toolparsers.tool_grammar import resolve_tool_choice, single_call

MARKERS = ["<|python_start|>", "<|python_end|>"]
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

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
            if end < 0:
                if not final:
                    return segments, start
                segments.append(Text(text[start:]))
                return segments, len(text)
            calls = _parse_calls(text[start:end])
            segments.extend(calls if calls is not None else [Text(text[start:end])])
            pos = end

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
        values = {}
        for kwarg in node.keywords:
            if kwarg.arg is None:
                return None
            try:
                values[kwarg.arg] = ast.literal_eval(kwarg.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        try:
            arguments = json.dumps(values, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            return None
        calls.append(Call(node.func.id, arguments))
    return calls

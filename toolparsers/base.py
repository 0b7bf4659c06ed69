"""Tool-call data types and the `ToolParser` base: whole-output parsing and the per-request streaming state.

Every parser splits the model's text into segments, `Text` (content) and `Call` (one tool call), with
`_scan`. Whole parsing and streaming share that one code path, so for any split of an output the merged
`feed()` results plus `finish()` equal `parse()` of the whole (content, call names and arguments; ids
are random per call). A call is sent only once it is complete and valid: its first delta carries
index, id and name with `arguments_delta == ""`, the second the whole arguments text. Text that could
still become a call (a partial marker, an unclosed block) is held back until it is decided; a
malformed or unfinished call ends up in the content verbatim, never as an exception.

Content rule (the same for `parse()` and streaming): the text outside calls, with whitespace (and the
parser's separator characters) next to a call removed; text before and after a call is joined by "\\n".
"""

from __future__ import annotations

import secrets
import string
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from constrained.spec import GrammarSpec
from constrained.structural_tag import StructuralTagGrammar
from toolparsers.brackets import Memo
from toolparsers.call_format import CallFormat
from toolparsers.tool_grammar import tool_grammar
from toolparsers.tool_spec import ToolChoice, ToolSpec

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """A fresh OpenAI-style tool-call id: "call_" + 24 random alphanumerics from `secrets`."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One finished tool call: `arguments` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One streamed piece of a call: `index` numbers calls 0..N-1 in order; `id` and `name` are set
    only on a call's first delta; `arguments_delta` fragments of one index concatenate to `arguments`."""

    index: int
    id: str | None
    name: str | None
    arguments_delta: str


@dataclass(slots=True)
class ParseResult:
    """Content text and tool calls: the whole output (`parse`) or only what is new (`feed`, `finish`).

    `tool_calls` lists the calls completed in this piece (all calls for `parse`); `deltas` the same
    calls as streaming deltas, with the same ids.
    """

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    deltas: list[ToolCallDelta] = field(default_factory=list)

    def extend(self, other: ParseResult) -> None:
        """Append `other` (a later piece of the same output) to this result in place."""
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)
        self.deltas.extend(other.deltas)


@dataclass(frozen=True, slots=True)
class Text:
    """A scanned piece of content text."""

    text: str


@dataclass(frozen=True, slots=True)
class Call:
    """A scanned, complete and valid tool call; `arguments` is JSON object text."""

    name: str
    arguments: str


Segment = Text | Call


class _ContentEmitter:
    """Turns `Text` pieces and call boundaries into content deltas, applying the content rule.

    Chunk-invariant: feeding a text in any pieces yields the same concatenated output.
    """

    def __init__(self, strip_after_call: str) -> None:
        self._strip_after_call = strip_after_call
        self._pending = ""          # trailing whitespace not sent yet: it is dropped if a call follows
        self._after_call = False    # dropping whitespace/separators that follow a call
        self._sent_any = False

    def text(self, piece: str) -> str:
        """Content to send for the next piece of outside-call text (may be "")."""
        if self._after_call:
            piece = piece.lstrip(self._strip_after_call)
            if not piece:
                return ""
            self._after_call = False
            if self._sent_any:
                self._pending = "\n"
        body = piece.rstrip()
        if not body:
            self._pending += piece
            return ""
        out = self._pending + body
        self._pending = piece[len(body):]
        self._sent_any = True
        return out

    def call(self) -> None:
        """A call was found here: drop the whitespace before it and what separates it from the next text."""
        self._pending = ""
        self._after_call = True

    def finish(self) -> str:
        """End of output: the trailing whitespace still held (none after a final call)."""
        out = "" if self._after_call else self._pending
        self._pending = ""
        return out


class ToolParser(ABC):
    """One tool-call format: `parse` whole outputs, stream with `feed`/`finish`, constrain with `grammar_for`
    (typed: `call_grammar`).

    An instance is the streaming state of one response: create one per choice. `tools` (optional)
    lets a parser convert argument values by the parameter schemas (qwen3_coder); the others ignore it.
    `call_format`: how the format writes one call (begin / end / trigger, SGLang's StructureInfo).
    """

    name: ClassVar[str]
    call_format: ClassVar[CallFormat]
    # Characters dropped from the content right after a call (llama3_json adds ";").
    strip_after_call: ClassVar[str] = string.whitespace

    def __init__(self, tools: list[ToolSpec] | None = None) -> None:
        self.tools = list(tools or [])
        self._buffer = ""
        self._emitter = _ContentEmitter(self.strip_after_call)
        self._num_calls = 0
        self._finished = False
        # Resume points of scans over the held-back buffer; valid while its front is not consumed.
        self._memo: Memo = {}

    @property
    def undecided(self) -> str:
        """The text fed but not decided yet (a partial marker or an unfinished call), which
        `finish` decides: content, or dropped with `cut`."""
        return self._buffer

    @abstractmethod
    def _scan(self, text: str, final: bool) -> tuple[list[Segment], int]:
        """Split a prefix of `text` into segments; return them and the number of characters consumed.

        The rest is held back and scanned again with more text. With `final` all of `text` is consumed
        (undecided text becomes `Text`). Decisions depend only on the consumed prefix, and every
        consumed position is a top-level position where scanning may restart.
        """

    def grammar_for(
        self, tools: list[ToolSpec], tool_choice: ToolChoice, parallel_tool_calls: bool = True
    ) -> GrammarSpec | None:
        """The constraint for this format as a GrammarSpec: `call_grammar`'s structural tag (formats
        whose calls are not structural tags override this). None for "none" (or auto without tools).

        Raises UnknownTool for a named choice outside `tools`, InvalidToolChoice for a bad value.
        """
        grammar = self.call_grammar(tools, tool_choice, parallel_tool_calls)
        return None if grammar is None else grammar.spec()

    def call_grammar(
        self, tools: list[ToolSpec], tool_choice: ToolChoice, parallel_tool_calls: bool = True
    ) -> StructuralTagGrammar | None:
        """The calls this format may write, as typed structural tags: None for "none" (or auto
        without tools), a forced call for "required"/named, free text plus triggered calls for
        "auto" (`toolparsers.tool_grammar.tool_grammar` from `call_format`; mistral overrides it).
        constrained/compose.py joins it with a JSON answer.

        Raises UnknownTool / InvalidToolChoice as `grammar_for`, NotComposable (part "calls") for a
        format whose calls are not structural tags (pythonic).
        """
        return tool_grammar(self.call_format, tools, tool_choice, parallel_tool_calls)

    def parse(self, text: str, cut: bool = False) -> ParseResult:
        """Parse a whole output into content and tool calls; never raises on malformed calls.

        `cut`: the output was cut short (max_tokens), see `finish`. Uses a fresh state
        (`type(self)(self.tools)`), so it does not touch this instance's stream.
        """
        state = type(self)(self.tools)
        result = state.feed(text)
        result.extend(state.finish(cut))
        return result

    def feed(self, delta: str) -> ParseResult:
        """Take the next piece of generated text; return the content and tool-call deltas now decided.

        Raises RuntimeError after `finish()`.
        """
        if self._finished:
            raise RuntimeError("feed() after finish()")
        self._buffer += delta
        segments, num_consumed = self._scan(self._buffer, final=False)
        if num_consumed:
            self._buffer = self._buffer[num_consumed:]
            self._memo.clear()
        return self._emit(segments)

    def finish(self, cut: bool = False) -> ParseResult:
        """End of output: decide and return everything still held back (partial markers, open blocks).

        `cut` (the output stopped at max_tokens): text still undecided at that point is a call the
        limit cut off, so it is dropped rather than returned as content (its calls, when it holds
        complete ones, are kept); without `cut`, undecided text becomes content verbatim.
        """
        if self._finished:
            return ParseResult()
        self._finished = True
        segments, num_consumed = self._scan(self._buffer, final=not cut)
        if cut:   # every consumed position is a top-level restart point: scan the rest on its own
            rest, _ = self._scan(self._buffer[num_consumed:], final=True)
            segments.extend(s for s in rest if not isinstance(s, Text))
        else:
            assert num_consumed == len(self._buffer), "final scan must consume everything"
        self._buffer = ""
        result = self._emit(segments)
        result.content += self._emitter.finish()
        return result

    def _emit(self, segments: list[Segment]) -> ParseResult:
        result = ParseResult()
        for segment in segments:
            if isinstance(segment, Text):
                result.content += self._emitter.text(segment.text)
                continue
            self._emitter.call()
            call = ToolCall(id=new_call_id(), name=segment.name, arguments=segment.arguments)
            result.tool_calls.append(call)
            result.deltas.append(ToolCallDelta(self._num_calls, call.id, call.name, ""))
            result.deltas.append(ToolCallDelta(self._num_calls, None, None, call.arguments))
            self._num_calls += 1
        return result

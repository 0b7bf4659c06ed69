"""Tool-call data types and the `ToolParser` base: whole-output parsing and the per-request streaming state.

Every parser splits the model's text into segments, `Text` (content) and `Call` (one tool call), with
`_scan`. Whole parsing and streaming share that one code path, so for any split of an output the merged
`feed()` results plus `finish()` equal `parse()` of the whole (content, call names and arguments, and
the deltas of each call concatenated; ids are random per call).

Streaming of an open call: once a call's name is known and its arguments have begun (the parser's
`_open_calls` sees it in the held-back text), its first delta goes out (index, id, name,
`arguments_delta == ""`), then argument fragments as the text arrives; the fragments of a call
concatenate to its final `arguments` exactly. JSON formats (hermes, llama3_json, mistral) stream the
model's own text of the arguments object, cut only where `toolparsers.json_prefix` says the prefix is
safe (never inside an escape or a surrogate pair, never past the first character that breaks the
JSON); formats that are not JSON on the wire (pythonic, qwen3_coder) stream the JSON they build, one
parameter at a time. A call whose name is not known before it completes (its arguments written
before its name, or as a JSON string) is sent whole when complete: header, then all its arguments.

A call whose header went out stays a call (a delta cannot be taken back). If its text then turns out
malformed (possible only where no grammar constrained it: `--no-constrain-auto-tools`), its last
fragment is the rest of what the model wrote for its arguments, verbatim: the arguments are then not
valid JSON, so a client's JSON parse fails loudly instead of running a call with half its arguments,
and `tool_calls_total{validity="invalid"}` counts it. The model's text is never dropped nor moved
to the content. `finish(cut=True)` (max_tokens) keeps its rule: a call still open at the cut is not
returned as a call nor as content, although its header and fragments were already streamed.

Text that could still become a call (a partial marker, an unclosed block) is held back until it is
decided; a malformed block whose header never went out ends up in the content verbatim, never as
an exception.

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
from toolparsers.json_prefix import JsonObjectPrefix
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
    calls as streaming deltas, with the same ids. `cut_call_ids`: the ids of those calls whose
    output ended before their arguments closed (a call whose header streamed is still returned, its
    arguments the model's text verbatim, by `finish()` without `cut`).
    """

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    deltas: list[ToolCallDelta] = field(default_factory=list)
    cut_call_ids: set[str] = field(default_factory=set)

    def extend(self, other: ParseResult) -> None:
        """Append `other` (a later piece of the same output) to this result in place."""
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)
        self.deltas.extend(other.deltas)
        self.cut_call_ids |= other.cut_call_ids


@dataclass(frozen=True, slots=True)
class Text:
    """A scanned piece of content text."""

    text: str


@dataclass(frozen=True, slots=True)
class Call:
    """A scanned tool call: `arguments` is JSON object text (or, for a call whose header streamed and
    whose text then broke, its text verbatim, see the module docstring). `complete`: False when the
    output ended before the arguments closed (such a call is dropped by `finish(cut=True)`)."""

    name: str
    arguments: str
    complete: bool = True


@dataclass(frozen=True, slots=True)
class OpenCall:
    """A call in the held-back text whose name is known: `arguments` is the prefix of its final
    arguments text that may be streamed now (`_open_calls`)."""

    name: str
    arguments: str


@dataclass(slots=True)
class _Streamed:
    """A call whose header went out while its text was still held back: what was sent of it."""

    index: int
    id: str
    name: str
    sent: str = ""


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
    `constrained`: a grammar constrains every call of this output (tool_choice required / named, or
    "auto" with constrained auto tools, from the trigger on), so a JSON call's name is decided once
    its string closes and hermes / llama3_json send the header then, before the arguments begin;
    never in parse-only mode, where a name is only trusted once the arguments have begun.
    `call_format`: how the format writes one call (begin / end / trigger, SGLang's StructureInfo).
    """

    name: ClassVar[str]
    call_format: ClassVar[CallFormat]
    # Characters dropped from the content right after a call (llama3_json adds ";").
    strip_after_call: ClassVar[str] = string.whitespace

    def __init__(self, tools: list[ToolSpec] | None = None, constrained: bool = False) -> None:
        self.tools = list(tools or [])
        self.constrained = constrained
        self._buffer = ""
        self._emitter = _ContentEmitter(self.strip_after_call)
        self._num_calls = 0
        self._finished = False
        # Resume points of scans over the held-back buffer; valid while its front is not consumed.
        self._memo: Memo = {}
        self._json_prefixes: dict[int, JsonObjectPrefix] = {}
        # Calls of the held-back text already streamed (header and fragments), in order.
        self._streamed: list[_Streamed] = []

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

    def _open_calls(self, text: str) -> list[OpenCall]:
        """The calls of the held-back `text` (what `_scan` did not consume) whose name is known, in
        order, each with the prefix of its arguments that may be streamed; [] (the default) for none.

        Contract: each call's `arguments` only grows as `text` grows, and when `_scan` later decides
        the text, it returns these calls first, as `Call`s whose arguments start with that prefix
        (whatever follows: a malformed rest is appended verbatim).
        """
        return []

    def _json_prefix(self, text: str, start: int) -> JsonObjectPrefix:
        """The resumable JSON-object reader of the arguments starting at `text[start]`, advanced over
        `text` (held-back buffer positions; reset when the buffer's front is consumed)."""
        reader = self._json_prefixes.get(start)
        if reader is None:
            reader = self._json_prefixes[start] = JsonObjectPrefix(start)
        reader.advance(text)
        return reader

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
        (`type(self)(self.tools, self.constrained)`), so it does not touch this instance's stream.
        """
        state = type(self)(self.tools, self.constrained)
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
            self._json_prefixes.clear()
        result = self._emit(segments)
        if num_consumed:
            assert not self._streamed, f"{self.name}: a streamed call was consumed without its Call"
        if self._buffer:
            self._stream_open(self._open_calls(self._buffer), result)
        return result

    def finish(self, cut: bool = False) -> ParseResult:
        """End of output: decide and return everything still held back (partial markers, open blocks).

        `cut` (the output stopped at max_tokens): text still undecided at that point is a call the
        limit cut off, so it is dropped rather than returned as content (its complete calls are kept,
        a call it cut is dropped); without `cut`, undecided text becomes content verbatim (or, for a
        call whose header streamed, its arguments, see the module docstring).
        """
        if self._finished:
            return ParseResult()
        self._finished = True
        segments, num_consumed = self._scan(self._buffer, final=not cut)
        if cut:   # every consumed position is a top-level restart point: scan the rest on its own
            self._memo.clear()
            self._json_prefixes.clear()
            rest, _ = self._scan(self._buffer[num_consumed:], final=True)
            segments.extend(s for s in rest if isinstance(s, Call) and s.complete)
        else:
            assert num_consumed == len(self._buffer), "final scan must consume everything"
        self._buffer = ""
        result = self._emit(segments)
        self._streamed.clear()  # with `cut`, a call still open is dropped (its deltas went out)
        result.content += self._emitter.finish()
        return result

    def _stream_open(self, open_calls: list[OpenCall], result: ParseResult) -> None:
        """Headers of newly named open calls and the new part of each open call's arguments."""
        for position, open_call in enumerate(open_calls):
            if position == len(self._streamed):
                self._emitter.call()   # the whitespace before the call is not content
                streamed = _Streamed(self._num_calls, new_call_id(), open_call.name)
                self._streamed.append(streamed)
                self._num_calls += 1
                result.deltas.append(ToolCallDelta(streamed.index, streamed.id, streamed.name, ""))
            streamed = self._streamed[position]
            assert open_call.name == streamed.name and open_call.arguments.startswith(streamed.sent), \
                f"{self.name}: an open call's streamed prefix changed"
            fragment = open_call.arguments[len(streamed.sent):]
            if fragment:
                streamed.sent = open_call.arguments
                result.deltas.append(ToolCallDelta(streamed.index, None, None, fragment))

    def _emit(self, segments: list[Segment]) -> ParseResult:
        result = ParseResult()
        for segment in segments:
            if isinstance(segment, Text):
                result.content += self._emitter.text(segment.text)
                continue
            self._emitter.call()
            if self._streamed:   # the held-back call whose header and fragments already went out
                streamed = self._streamed.pop(0)
                assert segment.name == streamed.name and segment.arguments.startswith(streamed.sent), \
                    f"{self.name}: a streamed call was decided differently"
                index, call_id, sent = streamed.index, streamed.id, streamed.sent
            else:
                index, call_id, sent = self._num_calls, new_call_id(), ""
                self._num_calls += 1
                result.deltas.append(ToolCallDelta(index, call_id, segment.name, ""))
            call = ToolCall(id=call_id, name=segment.name, arguments=segment.arguments)
            result.tool_calls.append(call)
            if not segment.complete:
                result.cut_call_ids.add(call_id)
            if len(call.arguments) > len(sent):
                result.deltas.append(ToolCallDelta(index, None, None, call.arguments[len(sent):]))
        return result

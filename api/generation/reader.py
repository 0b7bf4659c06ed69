"""Reading one choice's generated text: content, tool-call deltas and whole tool calls (`OutputReader`).

With tool calling, text goes through the request's tool parser, which streams a call as it is
generated (toolparsers/base.py): a header delta once its name is known, argument fragments as they
are written, and the whole `ToolCall` once it is complete. Text the parser holds back (a partial
`<tool_call>` marker) is not content yet; text that turns out not to be a call is content when that
is decided (at the latest at `finish`). `finish` also makes the one decision of how the choice
ended (`api/generation/ending.py`: finish_reason, and what becomes of a call left open). Each
endpoint shapes what it reads at its own edge: chat sends deltas, Responses emits items and
argument events, Messages content blocks.

`Read.events` gives one piece of output in order: the deltas (and completion) of calls already open
before it, then its content, then the calls it opens; a call's `ToolCall` follows its last delta.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from api.generation.constraints import ToolCalling
from api.generation.ending import decide_finish_reason
from toolparsers import ToolCall, ToolCallDelta


class ToolCallObserver(Protocol):
    """Sees a choice's tool calls and how it ended (api/observability/tool_call_metrics.py counts
    them, times the first delta and counts request_success by the decided finish_reason)."""

    def __call__(self, calls: list[ToolCall]) -> None:
        """The calls completed in one read piece of output."""

    def first_delta(self) -> None:
        """The choice's first tool-call delta (its first call's header) was read just now."""

    def finished(self, finish_reason: str) -> None:
        """The choice ended with `finish_reason`, the decision the client gets ("tool_calls",
        "stop", "length"; `api/generation/ending.py`)."""


ReadEvent = str | ToolCallDelta | ToolCall
"""In `Read.events`: content text, a call's delta (header or argument fragment), a completed call."""


@dataclass(slots=True)
class Read:
    """What a piece of output adds: content text, call deltas, the calls completed in it, and
    `events`, the same in output order (see the module docstring)."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    call_deltas: list[ToolCallDelta] = field(default_factory=list)
    events: list[ReadEvent] = field(default_factory=list)

    def extend(self, other: Read) -> None:
        """Append `other`, a later piece of the same output, in place."""
        self.content += other.content
        self.tool_calls.extend(other.tool_calls)
        self.call_deltas.extend(other.call_deltas)
        self.events.extend(other.events)


class OutputReader:
    """The reading state of one choice: `feed` each text delta, then `finish` once (or `read_whole`
    a whole output). `tool_calling` None: all text is content. `on_calls` sees each call once and
    the choice's first call delta. `finish_reason` is None until `finish`."""

    def __init__(self, tool_calling: ToolCalling | None, on_calls: ToolCallObserver | None = None) -> None:
        self._parser = tool_calling.new_parser() if tool_calling is not None else None
        self._forced = tool_calling is not None and tool_calling.forced
        self._on_calls = on_calls
        self.made_calls = False
        self.finish_reason: str | None = None
        self._index_of: dict[str, int] = {}   # call id -> index
        self._open: set[int] = set()          # indices whose header went out, not complete yet
        self._cut: set[str] = set()           # ids of the calls `finish` returned cut ("auto")

    @property
    def open_calls(self) -> set[int]:
        """Indices of calls whose header was read but which are not complete (after `finish(cut)`:
        the calls the cut dropped, although their deltas were read)."""
        return set(self._open)

    @property
    def cut_call_ids(self) -> set[str]:
        """Ids of the calls `finish` returned although the output ended inside them ("auto": their
        header streamed, their arguments are the model's text verbatim); empty before `finish`."""
        return set(self._cut)

    def feed(self, text: str) -> Read:
        """What the next text delta adds."""
        if self._parser is None:
            return Read(content=text, events=[text] if text else [])
        if not text:
            return Read()
        result = self._parser.feed(text)
        return self._seen(result.content, result.deltas, result.tool_calls)

    def finish(self, engine_reason: str) -> Read:
        """Everything still held back, once the engine ended the choice with `engine_reason`
        ("stop" or "length"); sets `finish_reason` (`api/generation/ending.py`).

        A call still open is dropped with a forced tool_choice (its markup never becomes content;
        its header and fragments may have streamed: it stays in `open_calls`). With "auto" the text
        the model wrote is never silently dropped: an open call whose header streamed is returned
        as that call, its arguments the model's text verbatim; other undecided text is content.
        """
        if self._parser is None:
            self.finish_reason = engine_reason
            return Read()
        undecided = self._parser.undecided.strip()
        result = self._parser.finish(cut=self._forced)
        self._cut = set(result.cut_call_ids)
        # left open ("auto" only): text that could still have become a call and is returned as
        # content, or as a call whose arguments never closed
        left_open = not self._forced and bool(undecided) and (not result.tool_calls or bool(result.cut_call_ids))
        read = self._seen(result.content, result.deltas, result.tool_calls)
        self.finish_reason = decide_finish_reason(engine_reason, self.made_calls, left_open)
        if self._on_calls is not None:
            self._on_calls.finished(self.finish_reason)
        return read

    def read_whole(self, text: str, engine_reason: str) -> Read:
        """A whole output at once: `feed(text)` followed by `finish(engine_reason)`."""
        read = self.feed(text)
        read.extend(self.finish(engine_reason))
        return read

    def _seen(self, content: str, deltas: list[ToolCallDelta], calls: list[ToolCall]) -> Read:
        opened = {delta.index for delta in deltas if delta.id is not None}   # calls this piece opens
        for delta in deltas:
            if delta.id is not None:
                self._index_of[delta.id] = delta.index
        groups: dict[int, list[ReadEvent]] = {}
        for delta in deltas:
            groups.setdefault(delta.index, []).append(delta)
        for call in calls:
            groups.setdefault(self._index_of[call.id], []).append(call)
        earlier = [event for index, group in groups.items() if index not in opened for event in group]
        later = [event for index, group in groups.items() if index in opened for event in group]
        events: list[ReadEvent] = [*earlier, *([content] if content else []), *later]
        if opened and not self._index_of.keys() - {d.id for d in deltas if d.id is not None}:
            if self._on_calls is not None:   # the first header of this choice
                self._on_calls.first_delta()
        self._open |= opened
        self._open -= {self._index_of[call.id] for call in calls}
        if calls:
            self.made_calls = True
            if self._on_calls is not None:
                self._on_calls(calls)
        return Read(content, list(calls), list(deltas), events)

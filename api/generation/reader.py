"""Reading one choice's generated text: content, whole tool calls and how it ended (`OutputReader`).

With tool calling, text goes through the request's tool parser; a call comes out once the parser
has it complete, so its arguments are always the final JSON. Text the parser holds back (a
partial `<tool_call>` marker) is not content yet; text that turns out not to be a call is content
when that is decided (at the latest at `finish`). `finish` also makes the one decision of how the
choice ended (`api/generation/ending.py`: finish_reason, and what becomes of a call left open).
Each endpoint shapes what it reads at its own edge: chat splits calls into deltas, Responses
emits items, Messages content blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from api.generation.constraints import ToolCalling
from api.generation.ending import decide_finish_reason
from toolparsers import ToolCall

ToolCallObserver = Callable[[list[ToolCall]], None]
"""Called with the calls completed in each read piece of output (api/observability/tool_call_metrics.py counts them)."""


@dataclass(slots=True)
class Read:
    """What a piece of output adds: content text and the tool calls completed in it."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class OutputReader:
    """The reading state of one choice: `feed` each text delta, then `finish` once (or `read_whole`
    a whole output). `tool_calling` None: all text is content. `on_calls` sees each call once.
    `finish_reason` is None until `finish`."""

    def __init__(self, tool_calling: ToolCalling | None, on_calls: ToolCallObserver | None = None) -> None:
        self._parser = tool_calling.new_parser() if tool_calling is not None else None
        self._forced = tool_calling is not None and tool_calling.forced
        self._on_calls = on_calls
        self.made_calls = False
        self.finish_reason: str | None = None

    def feed(self, text: str) -> Read:
        """What the next text delta adds."""
        if self._parser is None:
            return Read(content=text)
        if not text:
            return Read()
        result = self._parser.feed(text)
        return self._seen(Read(result.content, result.tool_calls))

    def finish(self, engine_reason: str) -> Read:
        """Everything still held back, once the engine ended the choice with `engine_reason`
        ("stop" or "length"); sets `finish_reason` (`api/generation/ending.py`).

        A call still open is dropped with a forced tool_choice (its markup never becomes content)
        and is content with "auto" (text the model wrote is never silently dropped).
        """
        if self._parser is None:
            self.finish_reason = engine_reason
            return Read()
        undecided = self._parser.undecided.strip()
        result = self._parser.finish(cut=self._forced)
        # left open as content ("auto" only): text that could still have become a call and did not
        left_open = not self._forced and bool(undecided) and not result.tool_calls
        read = self._seen(Read(result.content, result.tool_calls))
        self.finish_reason = decide_finish_reason(engine_reason, self.made_calls, left_open)
        return read

    def read_whole(self, text: str, engine_reason: str) -> Read:
        """A whole output at once: `feed(text)` followed by `finish(engine_reason)`."""
        read = self.feed(text)
        rest = self.finish(engine_reason)
        return Read(read.content + rest.content, read.tool_calls + rest.tool_calls)

    def _seen(self, read: Read) -> Read:
        if read.tool_calls:
            self.made_calls = True
            if self._on_calls is not None:
                self._on_calls(read.tool_calls)
        return read

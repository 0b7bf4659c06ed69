"""Reading one choice's generated text: content and whole tool calls (`OutputReader`).

With tool calling, text goes through the request's tool parser; a call comes out once the parser
has it complete, so its arguments are always the final JSON. Text the parser holds back (a
partial `<tool_call>` marker) is not content yet; text that turns out not to be a call is content
when that is decided (at the latest at `finish`). Each endpoint shapes what it reads at its own
edge: chat splits calls into deltas, Responses emits items.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from api.generation.constraints import ToolCalling
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
    a whole output). `tool_calling` None: all text is content. `on_calls` sees each call once."""

    def __init__(self, tool_calling: ToolCalling | None, on_calls: ToolCallObserver | None = None) -> None:
        self._parser = tool_calling.new_parser() if tool_calling is not None else None
        self._on_calls = on_calls
        self.made_calls = False

    def feed(self, text: str) -> Read:
        """What the next text delta adds."""
        if self._parser is None:
            return Read(content=text)
        if not text:
            return Read()
        result = self._parser.feed(text)
        return self._seen(Read(result.content, result.tool_calls))

    def finish(self, cut: bool = False) -> Read:
        """Everything still held back (`cut`: the output stopped at max_tokens, so a held-back
        partial call is dropped)."""
        if self._parser is None:
            return Read()
        result = self._parser.finish(cut)
        return self._seen(Read(result.content, result.tool_calls))

    def read_whole(self, text: str, cut: bool = False) -> Read:
        """A whole output at once: `feed(text)` followed by `finish(cut)`."""
        read = self.feed(text)
        rest = self.finish(cut)
        return Read(read.content + rest.content, read.tool_calls + rest.tool_calls)

    def finish_reason(self, engine_reason: str | None) -> str | None:
        """ "tool_calls" once the choice made calls (the engine ends a forced call with "stop"; a
        further call cut off by max_tokens is dropped, so the calls returned are whole), else the
        engine's reason ("stop", "length"), as vLLM reports it."""
        return "tool_calls" if self.made_calls else engine_reason

    def _seen(self, read: Read) -> Read:
        if read.tool_calls:
            self.made_calls = True
            if self._on_calls is not None:
                self._on_calls(read.tool_calls)
        return read

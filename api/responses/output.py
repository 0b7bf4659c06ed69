"""Engine text deltas of one response -> its output items, and the stream events that build them.

The same builder serves whole and streamed answers (a whole answer drops the events), so both
have the same items for the same engine deltas. Items are opened in output order and each is
closed before the next one opens: text becomes a `message` item (one output_text part), each
tool call a `function_call` item, opened (response.output_item.added) when the call's header is
read, its arguments streamed as response.function_call_arguments.delta events as they are
generated, then .done with the whole string and response.output_item.done. Text written after a
call opens a new message item. A call cut off by max_output_tokens gets its done events (status
"incomplete"); a forced one is left out of the response's output, as a whole answer leaves it out,
an "auto" one stays in it with status "incomplete" (its arguments the model's text verbatim).
Every item gets its added ... done events, also one that ends with no delta; a response with no
output at all gets one empty message, so that it always has an item. With logprobs, each
output_text delta carries the entries of the tokens it completes and the part (and its done event)
all of them; with tool calls, as in chat, only the content's tokens up to the first call have any
(api/protocol/logprobs_content.py).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from api.responses.protocol.events import (
    ContentPartEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    OutputItemEvent,
    OutputTextDelta,
    OutputTextDone,
    StreamEvent,
)
from api.responses.protocol.objects import FunctionCall, ItemStatus, OutputItem, OutputMessage, OutputText
from api.generation.constraints import ToolCalling
from api.generation.reader import OutputReader, Read, ToolCallObserver
from api.protocol.logprobs_content import ContentLogprobs
from api.protocol.logprobs_output import LogprobFormatter
from engine import TokenLogprob
from toolparsers import ToolCallDelta


class EventCounter:
    """Hands out the `sequence_number`s of one response's events: 0, 1, 2, ..."""

    def __init__(self) -> None:
        self._next = 0

    def next(self) -> int:
        """The next sequence number."""
        number = self._next
        self._next += 1
        return number


@dataclass(slots=True)
class _OpenMessage:
    id: str
    output_index: int
    texts: list[str] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class _OpenCall:
    item: FunctionCall
    output_index: int
    index: int   # the call's index in the choice (ToolCallDelta.index)
    arguments: list[str] = field(default_factory=list)


class ResponseOutputBuilder:
    """The output of one response: `feed` every engine text delta, then `finish` once.

    `tool_calling` None: all text is message content. Otherwise text goes through an OutputReader,
    whose whole calls become function_call items (and reach `on_tool_calls`). `logprobs`: formats
    the output_text logprobs (None: none requested, the lists stay empty).
    """

    def __init__(
        self,
        tool_calling: ToolCalling | None,
        counter: EventCounter,
        on_tool_calls: ToolCallObserver | None = None,
        logprobs: LogprobFormatter | None = None,
    ) -> None:
        self.items: list[OutputItem] = []
        self._seq = counter
        self._reader = OutputReader(tool_calling, on_tool_calls)
        self._open: _OpenMessage | _OpenCall | None = None
        self._fmt = logprobs
        self._content = (ContentLogprobs(logprobs.token_bytes)
                         if logprobs is not None and tool_calling is not None else None)
        self._logprobs: list[dict[str, Any]] = []   # entries not yet sent with a text delta

    @property
    def finish_reason(self) -> str | None:
        """How the output ended (the reader's decision, `api/generation/ending.py`); None until the
        last delta was fed."""
        return self._reader.finish_reason

    def feed(
        self, text: str, engine_reason: str | None = None, logprobs: list[TokenLogprob] | None = None
    ) -> list[StreamEvent]:
        """Events for the next text delta; with `engine_reason` (the last one: "stop" or "length")
        the reader also flushes what it holds and decides how the output ended; `logprobs`: the
        engine's entries released with `text`."""
        reads = [self._reader.feed(text)]
        final = engine_reason is not None
        if final:
            reads.append(self._reader.finish(engine_reason))
        if self._fmt is not None:
            entries = logprobs or []
            if self._content is not None:
                entries = self._content.read(entries, "".join(r.content for r in reads), final)
            self._logprobs.extend(e.model_dump(mode="json") for e in self._fmt.chat_entries(entries))
        events = [event for read in reads for event in self._read(read)]
        if final and isinstance(self._open, _OpenCall) and self._open.index in self._reader.open_calls:
            events.extend(self._close("incomplete"))   # cut inside this call: not in the output
            self.items.pop()
        return events

    def finish(self, incomplete: bool = False) -> list[StreamEvent]:
        """Close the open item (status "incomplete" when the output was cut); add an empty message
        when there is no item at all."""
        if not self.items and self._open is None:
            events = self._open_message()
        else:
            events = []
        events.extend(self._close("incomplete" if incomplete else "completed"))
        return events

    def abandon(self) -> list[StreamEvent]:
        """Close the open item as "incomplete" after a failure (its added event has its done event)."""
        return self._close("incomplete")

    def _text(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        if not isinstance(self._open, _OpenMessage):
            if self.items or self._open is not None:
                text = text.lstrip("\n")  # the parser joins text around a call with "\n"
                if not text:
                    return []
            events.extend(self._close("completed"))
            events.extend(self._open_message())
        message = self._open
        assert isinstance(message, _OpenMessage)
        message.texts.append(text)
        logprobs, self._logprobs = self._logprobs, []
        message.logprobs.extend(logprobs)
        events.append(
            OutputTextDelta(
                sequence_number=self._seq.next(),
                item_id=message.id,
                output_index=message.output_index,
                content_index=0,
                delta=text,
                logprobs=logprobs,
            )
        )
        return events

    def _open_message(self) -> list[StreamEvent]:
        message = _OpenMessage(id=f"msg_{uuid.uuid4().hex}", output_index=len(self.items))
        self._open = message
        item = OutputMessage(id=message.id, status="in_progress", content=[])
        return [
            OutputItemEvent(
                type="response.output_item.added",
                sequence_number=self._seq.next(),
                output_index=message.output_index,
                item=item,
            ),
            ContentPartEvent(
                type="response.content_part.added",
                sequence_number=self._seq.next(),
                item_id=message.id,
                output_index=message.output_index,
                content_index=0,
                part=OutputText(text=""),
            ),
        ]

    def _read(self, read: Read) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for event in read.events:
            if isinstance(event, str):
                events.extend(self._text(event))
            elif isinstance(event, ToolCallDelta):
                events.extend(self._call_delta(event))
            elif isinstance(self._open, _OpenCall) and self._open.item.call_id == event.id:
                # the call is whole, or ("auto") returned although the output ended inside it
                events.extend(self._close("incomplete" if event.id in self._reader.cut_call_ids else "completed"))
        return events

    def _call_delta(self, delta: ToolCallDelta) -> list[StreamEvent]:
        """A call's header opens its item (closing the one before); a fragment is an arguments delta."""
        if delta.id is not None:
            events = self._close("completed")
            item = FunctionCall(id=f"fc_{uuid.uuid4().hex}", call_id=delta.id, name=delta.name or "",
                                arguments="", status="in_progress")
            self._open = _OpenCall(item=item, output_index=len(self.items), index=delta.index)
            events.append(OutputItemEvent(type="response.output_item.added", sequence_number=self._seq.next(),
                                          output_index=self._open.output_index, item=item))
            return events
        opened = self._open
        if not isinstance(opened, _OpenCall) or opened.index != delta.index:
            return []   # a fragment of a call already closed (never sent by the parsers)
        opened.arguments.append(delta.arguments_delta)
        return [FunctionCallArgumentsDelta(sequence_number=self._seq.next(), item_id=opened.item.id,
                                           output_index=opened.output_index, delta=delta.arguments_delta)]

    def _close(self, status: ItemStatus) -> list[StreamEvent]:
        opened, self._open = self._open, None
        if opened is None:
            return []
        if isinstance(opened, _OpenMessage):
            return self._close_message(opened, status)
        arguments = "".join(opened.arguments)
        item = opened.item.model_copy(update={"arguments": arguments, "status": status})
        self.items.append(item)
        done = FunctionCallArgumentsDone(
            sequence_number=self._seq.next(),
            item_id=item.id,
            output_index=opened.output_index,
            name=item.name,
            arguments=arguments,
        )
        return [done, self._item_done(opened.output_index, item)]

    def _close_message(self, message: _OpenMessage, status: ItemStatus) -> list[StreamEvent]:
        text = "".join(message.texts)
        part = OutputText(text=text, logprobs=message.logprobs)
        item = OutputMessage(id=message.id, status=status, content=[part])
        self.items.append(item)
        item_id, output_index = message.id, message.output_index
        return [
            OutputTextDone(
                sequence_number=self._seq.next(),
                item_id=item_id,
                output_index=output_index,
                content_index=0,
                text=text,
                logprobs=message.logprobs,
            ),
            ContentPartEvent(
                type="response.content_part.done",
                sequence_number=self._seq.next(),
                item_id=item_id,
                output_index=output_index,
                content_index=0,
                part=part,
            ),
            self._item_done(message.output_index, item),
        ]

    def _item_done(self, output_index: int, item: OutputItem) -> OutputItemEvent:
        return OutputItemEvent(
            type="response.output_item.done",
            sequence_number=self._seq.next(),
            output_index=output_index,
            item=item,
        )

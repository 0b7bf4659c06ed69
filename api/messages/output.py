"""Engine outputs of one /v1/messages request -> Anthropic's stream events, and the message
object they add up to (a whole answer is built by the same code, so stream and whole agree).

Text goes through the request's `OutputReader` (`api/generation/reader.py`): content opens a
text block; a tool call opens a tool_use block (`toolu_...` id, `input: {}`) when its header is
read, its arguments go out as input_json_delta fragments as they are generated, and the block
stops when the call is complete. Each fragment leaves a prefix that is valid partial JSON
(`toolparsers.JsonObjectPrefix`), so the SDK's partial parse of each prefix never fails. A call whose
arguments turn out not to be a JSON object (possible only when the call was not constrained)
keeps as `input` what its sent prefix parses to, and the rest of its text (past what was sent)
becomes a text block after it. The prefix is parsed as the SDK parses the fragments it assembled
(jiter's partial mode in the anthropic SDK): a string still open is left out (a call cut in
`{"city": "Du` has input `{}`; its fragments did carry "Du"), so a whole answer equals the
streamed one. An "auto" call cut by max_tokens or a stop sequence after its header streamed is
such a call (`api/generation/ending.py`). A call cut off by max_tokens with a forced tool_choice
is stopped in the stream and left out of the message, as a whole answer leaves it out (the
SDK's own assembly of the stream keeps the block it saw start). stop_reason maps the reader's one
ending decision (`api/generation/ending.py`): finish_reason "tool_calls" -> "tool_use", "length"
-> "max_tokens", "stop" -> "stop_sequence" (with `stop_sequence`) when one of the request's
stop_sequences ended it, else "end_turn".
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from partial_json_parser import Allow
from partial_json_parser import loads as partial_json_loads

from api.generation.constraints import ToolCalling
from api.generation.reader import OutputReader, ToolCallObserver
from api.http.errors import anthropic_error
from api.messages.objects import (
    AnthropicError,
    ContentBlock,
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    InputJsonDelta,
    MessageDelta,
    MessageDeltaBody,
    MessageObject,
    MessageStart,
    MessageStop,
    MessageUsage,
    Ping,
    StopReason,
    StreamEvent,
    TextContent,
    TextDelta,
    ToolUseContent,
)
from api.protocol.response_meta import ResponseMeta
from engine import CompletionDelta, RequestOutput
from toolparsers import JsonObjectPrefix, ToolCallDelta

logger = logging.getLogger(__name__)

Outputs = AsyncIterator[tuple[int, RequestOutput]]

_CLOSED_STRINGS = Allow.ALL & ~Allow.STR
"""What partial-json-parser may complete in a malformed call's sent prefix: containers, not a string
still open (jiter's partial mode, which the anthropic SDK uses, drops it too)."""


@dataclass(frozen=True, slots=True)
class MessageOptions:
    """How to read the output: tool calling (None: all text), the observer of parsed calls
    (metrics), and the request's stop_sequences (to report which one matched)."""

    tool_calling: ToolCalling | None = None
    on_tool_calls: ToolCallObserver | None = None
    stop_sequences: tuple[str, ...] = ()


def usage_of(out: RequestOutput | None) -> MessageUsage:
    """Anthropic usage from an output's running totals: `input_tokens` are the prompt tokens not
    served by the prefix cache, `cache_read_input_tokens` those that were (their sum is the
    prompt, which /v1/messages/count_tokens counts)."""
    if out is None:
        return MessageUsage(input_tokens=0, output_tokens=0)
    return MessageUsage(
        input_tokens=out.num_prompt_tokens - out.num_cached_tokens,
        output_tokens=out.num_output_tokens,
        cache_read_input_tokens=out.num_cached_tokens,
    )


@dataclass(slots=True)
class _OpenToolUse:
    """The tool_use block being streamed: its place in `content`, the call's index and id, the
    arguments text read and how much of it was sent as input_json_delta."""

    block: int
    call_index: int
    call_id: str
    text: str = ""
    sent: int = 0
    reader: JsonObjectPrefix = field(default_factory=lambda: JsonObjectPrefix(0))


class MessageBuilder:
    """The reading state of one message: `start`, then `feed` every engine delta, then `finish`;
    each returns the stream events it adds, and `message()` is the answer so far."""

    def __init__(self, meta: ResponseMeta, options: MessageOptions) -> None:
        self.meta = meta
        self.options = options
        self.reader = OutputReader(options.tool_calling, options.on_tool_calls)
        self.content: list[ContentBlock] = []
        self.stop_reason: StopReason | None = None
        self.stop_sequence: str | None = None
        self.last: RequestOutput | None = None
        self._text_open = False
        self._pinged = False
        self._tool: _OpenToolUse | None = None

    def message(self) -> MessageObject:
        """The message object of what was read (usage from the last output seen)."""
        return MessageObject(
            id=self.meta.id,
            model=self.meta.model,
            content=list(self.content),
            stop_reason=self.stop_reason,
            stop_sequence=self.stop_sequence,
            usage=usage_of(self.last),
        )

    def start(self, first: RequestOutput | None) -> list[StreamEvent]:
        """message_start with empty content and the prompt's usage."""
        usage = usage_of(first).model_copy(update={"output_tokens": 0})
        return [MessageStart(message=MessageObject(id=self.meta.id, model=self.meta.model, content=[], usage=usage))]

    def feed(self, out: RequestOutput, delta: CompletionDelta) -> list[StreamEvent]:
        """The events of one engine delta (choice 0; Messages has one choice)."""
        self.last = out
        read = self.reader.feed(delta.text)
        if delta.finish_reason is not None:
            read.extend(self.reader.finish(delta.finish_reason))
            self._set_stop(delta)
        events: list[StreamEvent] = []
        for event in read.events:
            if isinstance(event, str):
                events += self._text(event)
            elif isinstance(event, ToolCallDelta):
                events += self._call_delta(event)
            elif self._tool is not None and self._tool.call_id == event.id:
                events += self._stop_tool_use()
        if self._tool is not None and self._tool.call_index in self.reader.open_calls and self.stop_reason:
            events += self._drop_cut_tool_use()
        return events

    def finish(self) -> list[StreamEvent]:
        """Close the open block; message_delta (stop reason, usage) and message_stop."""
        events = self._stop_tool_use() + self._close_text()
        if not self._pinged:
            events.append(Ping())
        delta = MessageDeltaBody(stop_reason=self.stop_reason, stop_sequence=self.stop_sequence)
        return [*events, MessageDelta(delta=delta, usage=usage_of(self.last)), MessageStop()]

    def _set_stop(self, delta: CompletionDelta) -> None:
        if self.reader.finish_reason == "tool_calls":
            self.stop_reason = "tool_use"
        elif self.reader.finish_reason == "length":
            self.stop_reason = "max_tokens"
        elif isinstance(delta.stop_reason, str) and delta.stop_reason in self.options.stop_sequences:
            self.stop_reason, self.stop_sequence = "stop_sequence", delta.stop_reason
        else:
            self.stop_reason = "end_turn"

    def _open(self, block: ContentBlock, opening: ContentBlock) -> list[StreamEvent]:
        """Append `block` to the content; its start event shows `opening` (empty text or input)."""
        self.content.append(block)
        events: list[StreamEvent] = [ContentBlockStart(index=len(self.content) - 1, content_block=opening)]
        if not self._pinged:
            self._pinged = True
            events.append(Ping())
        return events

    def _text(self, text: str) -> list[StreamEvent]:
        if not text:
            return []
        events: list[StreamEvent] = []
        if not self._text_open:
            events += self._open(TextContent(text=""), TextContent(text=""))
            self._text_open = True
        block = self.content[-1]
        assert isinstance(block, TextContent)
        block.text += text
        return [*events, ContentBlockDelta(index=len(self.content) - 1, delta=TextDelta(text=text))]

    def _close_text(self) -> list[StreamEvent]:
        if not self._text_open:
            return []
        self._text_open = False
        return [ContentBlockStop(index=len(self.content) - 1)]

    def _call_delta(self, delta: ToolCallDelta) -> list[StreamEvent]:
        """A header opens a tool_use block (stopping the one before); a fragment streams its safe part."""
        if delta.id is not None:
            events = self._stop_tool_use() + self._close_text()
            block = ToolUseContent(id=f"toolu_{uuid.uuid4().hex[:24]}", name=delta.name or "", input={})
            events += self._open(block, block.model_copy())
            self._tool = _OpenToolUse(len(self.content) - 1, delta.index, delta.id)
            return events
        tool = self._tool
        if tool is None or tool.call_index != delta.index:
            return []   # a fragment of a call already stopped (never sent by the parsers)
        tool.text += delta.arguments_delta
        tool.reader.advance(tool.text)
        return self._send_safe(tool)

    def _send_safe(self, tool: _OpenToolUse) -> list[StreamEvent]:
        if tool.reader.safe_end <= tool.sent:
            return []
        fragment = tool.text[tool.sent:tool.reader.safe_end]
        tool.sent = tool.reader.safe_end
        return [ContentBlockDelta(index=tool.block, delta=InputJsonDelta(partial_json=fragment))]

    def _stop_tool_use(self) -> list[StreamEvent]:
        """Stop the open tool_use block with its input; text past a malformed input becomes text."""
        tool, self._tool = self._tool, None
        if tool is None:
            return []
        events = self._send_safe(tool)
        complete = tool.reader.end >= 0 and not tool.text[tool.reader.end:].strip()
        sent = tool.text[:tool.sent]
        # an open string is left out, as the SDK's partial parse of the streamed fragments leaves it
        value = json.loads(sent) if complete else (partial_json_loads(sent, _CLOSED_STRINGS) if sent else {})
        block = self.content[tool.block]
        assert isinstance(block, ToolUseContent)
        block.input = value if isinstance(value, dict) else {}
        events.append(ContentBlockStop(index=tool.block))
        if not complete:
            logger.info("request %s: call of %s with malformed arguments: the rest is text",
                        self.meta.id, block.name)
            events += self._text(tool.text[tool.sent:])
        return events

    def _drop_cut_tool_use(self) -> list[StreamEvent]:
        """max_tokens cut the open call: stop its block, and leave it out of the message."""
        tool, self._tool = self._tool, None
        assert tool is not None
        self.content.pop(tool.block)
        return [ContentBlockStop(index=tool.block)]


async def message_events(outputs: Outputs, builder: MessageBuilder) -> AsyncIterator[StreamEvent]:
    """The stream events of a request. A failure after message_start is one `error` event
    (Anthropic's error body), and the stream ends there."""
    started = False
    try:
        async with contextlib.aclosing(outputs):  # type: ignore[type-var]
            async for _, out in outputs:
                if not started:
                    started = True
                    for event in builder.start(out):
                        yield event
                for delta in out.deltas:
                    for event in builder.feed(out, delta):
                        yield event
        for event in builder.finish():
            yield event
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error can only be an event
        logger.warning("request %s: stream failed: %s", builder.meta.id, exc)
        _, body = anthropic_error(exc)
        yield AnthropicError.model_validate(body)


async def whole_message(outputs: Outputs, builder: MessageBuilder) -> MessageObject:
    """Read every output into the finished message object (errors are raised)."""
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for _, out in outputs:
            for delta in out.deltas:
                builder.feed(out, delta)
    builder.finish()
    return builder.message()

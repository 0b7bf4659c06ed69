"""Engine outputs of one /v1/messages request -> Anthropic's stream events, and the message
object they add up to (a whole answer is built by the same code, so stream and whole agree).

Text goes through the request's `OutputReader` (`api/generation/reader.py`): content opens a
text block, each whole tool call becomes one tool_use block (`toolu_...` id) whose `input` JSON
is sent as one input_json_delta once the call is complete. A call whose arguments are not a
JSON object (possible only when the call was not constrained) cannot be a tool_use block and is
returned as text. stop_reason maps the reader's one ending decision
(`api/generation/ending.py`): finish_reason "tool_calls" -> "tool_use", "length" ->
"max_tokens", "stop" -> "stop_sequence" (with `stop_sequence`) when one of the request's
stop_sequences ended it, else "end_turn".
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from api.generation.constraints import ToolCalling
from api.generation.reader import OutputReader, Read, ToolCallObserver
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
from toolparsers import ToolCall

logger = logging.getLogger(__name__)

Outputs = AsyncIterator[tuple[int, RequestOutput]]


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
            rest = self.reader.finish(delta.finish_reason)
            read = Read(read.content + rest.content, read.tool_calls + rest.tool_calls)
            self._set_stop(delta)
        events = self._text(read.content)
        for call in read.tool_calls:
            events += self._tool_use(call)
        return events

    def finish(self) -> list[StreamEvent]:
        """Close the open block; message_delta (stop reason, usage) and message_stop."""
        events = self._close_text()
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

    def _tool_use(self, call: ToolCall) -> list[StreamEvent]:
        arguments = _arguments_object(call.arguments)
        if arguments is None:
            logger.info("request %s: call of %s without an arguments object returned as text",
                        self.meta.id, call.name)
            return self._text(call.arguments)
        events = self._close_text()
        block = ToolUseContent(id=f"toolu_{uuid.uuid4().hex[:24]}", name=call.name, input=arguments)
        events += self._open(block, block.model_copy(update={"input": {}}))
        index = len(self.content) - 1
        events.append(ContentBlockDelta(index=index, delta=InputJsonDelta(partial_json=call.arguments)))
        return [*events, ContentBlockStop(index=index)]


def _arguments_object(arguments: str) -> dict[str, object] | None:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


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

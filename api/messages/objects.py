"""The answers of /v1/messages: the message object, its stream events, the count_tokens result
and the error body, as Anthropic documents them (https://docs.anthropic.com/en/api/messages,
https://docs.anthropic.com/en/docs/build-with-claude/streaming; the anthropic SDK's types).

Stream order: message_start, then per content block content_block_start, content_block_delta
(text_delta or input_json_delta)..., content_block_stop (a ping after the first block start),
then message_delta (stop_reason, stop_sequence, usage) and message_stop. A failure after the
stream started is one `error` event.
"""

from __future__ import annotations

from typing import Any, Literal

from api.protocol.common import ResponseModel

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(ResponseModel):
    """A text block of the answer."""

    type: Literal["text"] = "text"
    text: str


class ToolUseContent(ResponseModel):
    """A tool call of the answer: `id` is `toolu_...`, `input` the arguments object."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = TextContent | ToolUseContent


class MessageUsage(ResponseModel):
    """Token counts: `input_tokens` are all prompt tokens, `cache_read_input_tokens` those served
    by the prefix cache; blocks are cached as they fill, never written on request, so
    `cache_creation_input_tokens` is 0."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class MessageObject(ResponseModel):
    """`{"type": "message", "role": "assistant", ...}`."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: MessageUsage


class CountTokensResult(ResponseModel):
    """`{"input_tokens": N}` of /v1/messages/count_tokens."""

    input_tokens: int


class MessageStart(ResponseModel):
    """First event: the message with empty content and the input usage."""

    type: Literal["message_start"] = "message_start"
    message: MessageObject


class ContentBlockStart(ResponseModel):
    """A block opens at `index`: text with "" or tool_use with `input: {}`."""

    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock


class TextDelta(ResponseModel):
    """More text of a text block."""

    type: Literal["text_delta"] = "text_delta"
    text: str


class InputJsonDelta(ResponseModel):
    """A fragment of a tool_use block's `input` JSON text."""

    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class ContentBlockDelta(ResponseModel):
    """A delta of the block at `index`."""

    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextDelta | InputJsonDelta


class ContentBlockStop(ResponseModel):
    """The block at `index` is complete."""

    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class Ping(ResponseModel):
    """A keep-alive event."""

    type: Literal["ping"] = "ping"


class MessageDeltaBody(ResponseModel):
    """The top-level changes of message_delta."""

    stop_reason: StopReason | None = None
    stop_sequence: str | None = None


class MessageDelta(ResponseModel):
    """Stop reason and final usage (cumulative)."""

    type: Literal["message_delta"] = "message_delta"
    delta: MessageDeltaBody
    usage: MessageUsage


class MessageStop(ResponseModel):
    """Last event of a stream that did not fail."""

    type: Literal["message_stop"] = "message_stop"


class AnthropicErrorInfo(ResponseModel):
    """The inner error: `type` one of Anthropic's error types, `message` for people."""

    type: str
    message: str


class AnthropicError(ResponseModel):
    """`{"type": "error", "error": {"type", "message"}}`: error bodies and the in-stream error event."""

    type: Literal["error"] = "error"
    error: AnthropicErrorInfo


StreamEvent = (
    MessageStart | ContentBlockStart | ContentBlockDelta | ContentBlockStop | Ping | MessageDelta
    | MessageStop | AnthropicError
)

"""ChatCompletion (whole) and ChatCompletionChunk (streamed) response objects."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import SerializerFunctionWrapHandler, model_serializer

from api.protocol.common import ResponseModel, SparseResponseModel, Usage
from api.protocol.logprobs import ChoiceLogprobs
from api.protocol.messages import ToolCall


class ChatCompletionMessage(ResponseModel):
    """The assistant message of a whole response; `tool_calls` is present only when calls were made."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None

    @model_serializer(mode="wrap")
    def _omit_empty_tool_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("tool_calls") is None:
            data.pop("tool_calls", None)
        return data


class ChatCompletionChoice(ResponseModel):
    """One of the `n` choices of a whole response."""

    index: int
    message: ChatCompletionMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletion(ResponseModel):
    """`object: "chat.completion"`."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage
    system_fingerprint: str | None = None
    service_tier: str | None = None


class DeltaFunctionCall(SparseResponseModel):
    """A fragment of a streamed function call: `name` on the first delta, then `arguments` text."""

    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(SparseResponseModel):
    """A streamed tool-call delta; `index` identifies the call within the choice."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(SparseResponseModel):
    """`choices[].delta`: only the keys that changed (`role` on the first chunk of a choice)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionChunkChoice(ResponseModel):
    """One choice's delta in one chunk; `finish_reason` is null until the choice ends."""

    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(ResponseModel):
    """`object: "chat.completion.chunk"`; `usage` is null except on the final usage-only chunk."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None

"""The /v1/chat/completions shapes: the request body (OpenAI fields verbatim, plus vLLM
extensions), ChatCompletion (whole) and ChatCompletionChunk (streamed)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer
from pydantic_core import PydanticCustomError

from api.protocol.common import ResponseModel, SparseResponseModel, Usage
from api.protocol.logprobs import ChoiceLogprobs
from api.protocol.messages import ChatMessage, Tool, ToolCall, ToolChoice
from api.protocol.sampling_fields import SamplingFields
from api.protocol.validators import reject_when_set
from engine import MAX_LOGPROBS



class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions.

    Accepted and ignored (no effect on a self-hosted text model): metadata, store, service_tier,
    reasoning_effort, verbosity, prediction, prompt_cache_*, safety_identifier, moderation.
    Rejected with a plain 400: audio output, web_search_options, the deprecated
    functions/function_call. tools, tool_choice and parallel_tool_calls: see `api/generation/constraints.py`.
    """

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, json_schema_extra={"minimum": 1})
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, json_schema_extra={"minimum": 0, "maximum": MAX_LOGPROBS})
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    prediction: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    moderation: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    # vLLM extensions
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        other = [m for m in value or [] if m != "text"]
        if other:
            raise PydanticCustomError(
                "not_supported", "output modality '{m}' is not supported; only 'text'", {"m": other[0]}
            )
        return value

    _unsupported = field_validator("audio", "web_search_options", "functions", "function_call")(
        reject_when_set
    )

    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens`, else the deprecated `max_tokens`, else None (rest of context)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


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

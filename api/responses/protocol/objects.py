"""The `response` object of /v1/responses, its output items and the stored input items, in the
shapes of the OpenAI SDK's `openai.types.responses` (Response, ResponseOutputMessage,
ResponseFunctionToolCall, ResponseInputMessageItem, ResponseFunctionToolCallOutputItem)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from api.protocol.common import ResponseModel

ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(ResponseModel):
    """`{"type": "output_text", "text", "annotations": [], "logprobs": []}`."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class InputText(ResponseModel):
    """`{"type": "input_text", "text"}` of a stored user/system/developer message."""

    type: Literal["input_text"] = "input_text"
    text: str


class OutputMessage(ResponseModel):
    """An assistant message item (`id` "msg_...")."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class InputMessage(ResponseModel):
    """A stored user/system/developer message item (`id` "msg_...")."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer"]
    status: ItemStatus = "completed"
    content: list[InputText]


class FunctionCall(ResponseModel):
    """A function_call item (`id` "fc_...", `call_id` "call_..."); `arguments` is JSON text."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


class FunctionCallOutput(ResponseModel):
    """A stored function_call_output item (`id` "fco_...")."""

    id: str
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str
    status: ItemStatus = "completed"


OutputItem = OutputMessage | FunctionCall
StoredInputItem = InputMessage | OutputMessage | FunctionCall | FunctionCallOutput


class InputTokensDetails(ResponseModel):
    """`cached_tokens`: prompt tokens served by the prefix cache."""

    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(ResponseModel):
    """`reasoning_tokens`: always 0 (no reasoning items are produced)."""

    reasoning_tokens: int = 0


class ResponseUsage(ResponseModel):
    """Token counts of one response."""

    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, num_prompt_tokens: int, num_output_tokens: int, num_cached_tokens: int) -> ResponseUsage:
        """Usage whose total is input + output."""
        return cls(
            input_tokens=num_prompt_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=num_cached_tokens),
            output_tokens=num_output_tokens,
            total_tokens=num_prompt_tokens + num_output_tokens,
        )


class ResponseError(ResponseModel):
    """`error` of a failed response; `code` is one of the SDK's literals ("server_error")."""

    code: str = "server_error"
    message: str


class IncompleteDetails(ResponseModel):
    """Why a response is incomplete: here always "max_output_tokens"."""

    reason: Literal["max_output_tokens"] = "max_output_tokens"


class ResponseObject(ResponseModel):
    """`object: "response"`. Request settings are echoed (tools, tool_choice, text, ...)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    background: bool = False
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    service_tier: str = "default"
    store: bool = True
    temperature: float = 1.0
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int = 0
    top_p: float = 1.0
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class ResponseDeleted(ResponseModel):
    """The body of DELETE /v1/responses/{id}."""

    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


class InputItemList(ResponseModel):
    """A page of GET /v1/responses/{id}/input_items."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None
    last_id: str | None
    has_more: bool

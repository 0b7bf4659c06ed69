"""The streaming events of /v1/responses (`stream: true`), fields as the OpenAI SDK's
`openai.types.responses.*Event` classes define them. Each has `type` and `sequence_number`
(0, 1, 2, ... within one response)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from api.protocol.common import ResponseModel
from api.responses.protocol.objects import OutputItem, OutputText, ResponseObject


class ResponseLifecycleEvent(ResponseModel):
    """response.created / in_progress / queued / completed / incomplete / failed: the whole response."""

    type: Literal[
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.completed",
        "response.incomplete",
        "response.failed",
    ]
    sequence_number: int
    response: ResponseObject


class OutputItemEvent(ResponseModel):
    """response.output_item.added (item in progress) / response.output_item.done (item finished)."""

    type: Literal["response.output_item.added", "response.output_item.done"]
    sequence_number: int
    output_index: int
    item: OutputItem


class ContentPartEvent(ResponseModel):
    """response.content_part.added (empty text) / response.content_part.done (the whole text)."""

    type: Literal["response.content_part.added", "response.content_part.done"]
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    part: OutputText


class OutputTextDelta(ResponseModel):
    """response.output_text.delta: the next piece of a message's text."""

    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class OutputTextDone(ResponseModel):
    """response.output_text.done: the message's whole text."""

    type: Literal["response.output_text.done"] = "response.output_text.done"
    sequence_number: int
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class FunctionCallArgumentsDelta(ResponseModel):
    """response.function_call_arguments.delta: the next piece of a call's arguments."""

    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    sequence_number: int
    item_id: str
    output_index: int
    delta: str


class FunctionCallArgumentsDone(ResponseModel):
    """response.function_call_arguments.done: the call's whole arguments (and its name)."""

    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    sequence_number: int
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(ResponseModel):
    """`error`: a failure after the stream started (followed by response.failed)."""

    type: Literal["error"] = "error"
    sequence_number: int
    code: str | None = None
    message: str
    param: str | None = None


StreamEvent = (
    ResponseLifecycleEvent
    | OutputItemEvent
    | ContentPartEvent
    | OutputTextDelta
    | OutputTextDone
    | FunctionCallArgumentsDelta
    | FunctionCallArgumentsDone
    | ErrorEvent
)

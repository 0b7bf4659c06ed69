"""A /v1/responses request's conversation -> chat messages for the shared rendering path, and its
input items in the stored shape (with ids) that GET .../input_items lists.

The conversation is: `instructions` (a system message; not carried over from earlier responses,
as on OpenAI), the stored history of `previous_response_id` (its chain's input and output items),
then `input`. Items map to chat messages as OpenAI's own Responses-to-chat mapping does:

| item | chat message |
| --- | --- |
| message (user / system / developer / assistant) | that role; list content joined by newlines |
| function_call | a tool call of the assistant message right before it, else of a new one |
| function_call_output | role "tool" with `tool_call_id` = `call_id` |

A function_call_output whose call_id matches no earlier function_call is a 400.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from api.http.errors import InvalidRequest
from api.protocol.messages import (
    AssistantMessage,
    ChatMessage,
    DeveloperMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from api.protocol.messages import FunctionCall as ChatFunctionCall
from api.protocol.responses_items import FunctionCallItem, FunctionCallOutputItem, InputItem, MessageItem
from api.protocol.responses_object import (
    FunctionCall,
    FunctionCallOutput,
    InputMessage,
    InputText,
    OutputMessage,
    OutputText,
    StoredInputItem,
)
from api.protocol.responses_request import ResponsesRequest

_ITEMS = TypeAdapter(list[InputItem])
_ROLES: dict[str, type[SystemMessage | DeveloperMessage | UserMessage]] = {
    "system": SystemMessage,
    "developer": DeveloperMessage,
    "user": UserMessage,
}


@dataclass(frozen=True, slots=True)
class ResponsesConversation:
    """The chat messages to render and this request's input items in their stored shape."""

    messages: list[ChatMessage]
    input_items: list[StoredInputItem]


def build_conversation(body: ResponsesRequest, history: Sequence[dict[str, Any]]) -> ResponsesConversation:
    """Messages for `instructions` + `history` (stored item dicts) + `input`, and the input items.

    Raises InvalidRequest (param `input[i].call_id`) for a function_call_output without a matching
    earlier function_call, and (param `input`) when the conversation is empty.
    """
    items = [MessageItem(role="user", content=body.input)] if isinstance(body.input, str) else body.input
    earlier = _ITEMS.validate_python(list(history))
    call_ids = {item.call_id for item in earlier if isinstance(item, FunctionCallItem)}
    for i, item in enumerate(items):
        if isinstance(item, FunctionCallItem):
            call_ids.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem) and item.call_id not in call_ids:
            raise InvalidRequest(
                f"No tool call found for function call output with call_id {item.call_id}",
                param=f"input[{i}].call_id",
            )
    messages: list[ChatMessage] = []
    if body.instructions:
        messages.append(SystemMessage(role="system", content=body.instructions))
    messages.extend(items_to_messages([*earlier, *items]))
    if not messages:
        raise InvalidRequest("input must hold at least one item", param="input")
    return ResponsesConversation(messages, [stored_item(item) for item in items])


def items_to_messages(items: Sequence[InputItem]) -> list[ChatMessage]:
    """Chat messages for Responses items (see the module table)."""
    messages: list[ChatMessage] = []
    for item in items:
        if isinstance(item, MessageItem):
            if item.role == "assistant":
                messages.append(AssistantMessage(role="assistant", content=item.text()))
            else:
                messages.append(_ROLES[item.role](role=item.role, content=item.text()))  # type: ignore[arg-type]
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(
                id=item.call_id, function=ChatFunctionCall(name=item.name, arguments=item.arguments)
            )
            last = messages[-1] if messages else None
            if isinstance(last, AssistantMessage):
                messages[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or []), call]})
            else:
                messages.append(AssistantMessage(role="assistant", tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(ToolMessage(role="tool", content=item.text(), tool_call_id=item.call_id))
    return messages


def stored_item(item: InputItem) -> StoredInputItem:
    """The item as GET .../input_items returns it: an id (the client's, else a fresh one), `type`,
    `status` "completed", list content."""
    if isinstance(item, MessageItem):
        item_id = item.id or f"msg_{uuid.uuid4().hex}"
        if item.role == "assistant":
            return OutputMessage(id=item_id, status="completed", content=[OutputText(text=item.text())])
        return InputMessage(id=item_id, role=item.role, content=[InputText(text=item.text())])
    if isinstance(item, FunctionCallItem):
        return FunctionCall(
            id=item.id or f"fc_{uuid.uuid4().hex}",
            call_id=item.call_id,
            name=item.name,
            arguments=item.arguments,
            status="completed",
        )
    assert isinstance(item, FunctionCallOutputItem), "unsupported items are rejected at validation"
    return FunctionCallOutput(
        id=item.id or f"fco_{uuid.uuid4().hex}", call_id=item.call_id, output=item.text()
    )

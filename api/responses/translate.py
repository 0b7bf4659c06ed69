"""A /v1/responses request -> GenerationInputs (its own translation, not chat's shapes), and its
input items in the stored shape (with ids) that GET .../input_items lists.

The conversation is: `instructions` (a system message; not carried over from earlier responses,
as on OpenAI), the stored history of `previous_response_id` (its chain's input and output items),
then `input`. Items map to conversation turns as OpenAI's own Responses-to-chat mapping does:

| item | turn |
| --- | --- |
| message (user / system / developer / assistant) | that role (developer as system); list content joined by newlines |
| function_call | a tool call of the assistant turn right before it, else of a new one |
| function_call_output | role "tool" with `tool_call_id` = `call_id` |

A function_call_output whose call_id matches no earlier function_call is a 400. Tools, tool_choice
and text.format give the same grammars, tool parsing and 400s as chat, with Responses field
names in `param` (`tools[i].parameters`, `text.format.schema`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from api.errors import InvalidRequest
from api.generation.constraints import json_object_grammar, json_schema_grammar
from api.generation.inputs import (
    FunctionTool,
    GenerationInputs,
    Message,
    NamedTool,
    RenderOptions,
    RequestGrammar,
    ToolChoice,
    ToolInputs,
)
from api.protocol.sampling import sampling_params
from api.responses.protocol.items import FunctionCallItem, FunctionCallOutputItem, InputItem, MessageItem
from api.responses.protocol.objects import (
    FunctionCall,
    FunctionCallOutput,
    InputMessage,
    InputText,
    OutputMessage,
    OutputText,
    StoredInputItem,
)
from api.responses.protocol.request import (
    FunctionToolChoice,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from api.responses.protocol.request import FunctionTool as ResponsesFunctionTool
from toolparsers import ToolCall

_ITEMS = TypeAdapter(list[InputItem])


@dataclass(frozen=True, slots=True)
class ResponsesInputs:
    """The generation inputs of a Responses request and its input items in their stored shape."""

    inputs: GenerationInputs
    input_items: list[StoredInputItem]


def translate(
    body: ResponsesRequest, history: Sequence[dict[str, Any]], adapter: str | None
) -> ResponsesInputs:
    """The inputs for `instructions` + `history` (stored item dicts) + `input`, on `adapter`.
    Walks the format's and tools' schemas: call it off the event loop.

    Raises InvalidRequest (param `input[i].call_id`) for a function_call_output without a matching
    earlier function_call, (param `input`) when the conversation is empty, and for a malformed
    text.format schema; InvalidSamplingParams (param: the field sent) for out-of-range or
    inconsistent sampling values.
    """
    messages, input_items = conversation(body, history)
    sampling = sampling_params(
        {"max_tokens": "max_output_tokens", "logprobs": "top_logprobs"},
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        max_tokens=body.max_output_tokens,
        stop=tuple(body.stop_list()),
        logprobs=body.logprobs(),
    )
    inputs = GenerationInputs(
        messages=messages,
        sampling=sampling,
        tools=ToolInputs(_tools(body), _tool_choice(body), body.parallel_tool_calls),
        output_format=_format(body),
        render=RenderOptions(prompt_param="input"),
        adapter=adapter,
        cache_salt=body.cache_salt,
    )
    return ResponsesInputs(inputs, input_items)


def conversation(
    body: ResponsesRequest, history: Sequence[dict[str, Any]]
) -> tuple[tuple[Message, ...], list[StoredInputItem]]:
    """The turns for `instructions` + `history` + `input`, and this request's stored input items
    (see `translate` for the 400s)."""
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
    messages: list[Message] = []
    if body.instructions:
        messages.append(Message(role="system", content=body.instructions))
    messages.extend(items_to_messages([*earlier, *items]))
    if not messages:
        raise InvalidRequest("input must hold at least one item", param="input")
    return tuple(messages), [stored_item(item) for item in items]


def items_to_messages(items: Sequence[InputItem]) -> list[Message]:
    """Conversation turns for Responses items (see the module table)."""
    messages: list[Message] = []
    for item in items:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append(Message(role=role, content=item.text()))  # type: ignore[arg-type]
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, name=item.name, arguments=item.arguments)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                messages[-1] = dataclasses.replace(last, tool_calls=(*last.tool_calls, call))
            else:
                messages.append(Message(role="assistant", tool_calls=(call,)))
        elif isinstance(item, FunctionCallOutputItem):
            messages.append(Message(role="tool", content=item.text(), tool_call_id=item.call_id))
    return messages


def _tools(body: ResponsesRequest) -> tuple[FunctionTool, ...]:
    """`tools` (validation has already refused every type but function)."""
    tools = []
    for i, tool in enumerate(body.tools or ()):
        assert isinstance(tool, ResponsesFunctionTool)
        tools.append(
            FunctionTool(
                name=tool.name,
                parameters_param=f"tools[{i}].parameters",
                description=tool.description,
                parameters=tool.parameters,
                strict=tool.strict,
            )
        )
    return tuple(tools)


def _tool_choice(body: ResponsesRequest) -> ToolChoice | None:
    choice = body.tool_choice
    if isinstance(choice, FunctionToolChoice):
        return NamedTool(choice.name)
    return choice  # type: ignore[return-value]


def _format(body: ResponsesRequest) -> RequestGrammar | None:
    """The grammar of `text.format` (None for text or no format)."""
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, TextFormatJsonSchema):
        return json_schema_grammar(fmt.json_schema, "text.format.schema")
    if isinstance(fmt, TextFormatJsonObject):
        return json_object_grammar("text.format")
    return None


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

"""Chat-shaped messages, tools and tool_choice (`api/protocol/messages.py`) -> generation's plain
inputs; shared by /v1/chat/completions and /tokenize, so both render the same prompt."""

from __future__ import annotations

from collections.abc import Sequence

from api.generation.inputs import Message, NamedTool, ToolChoice, ToolInputs
from api.generation.inputs import FunctionTool as ToolInput
from api.protocol.messages import (
    AssistantMessage,
    ChatMessage,
    ContentPart,
    DeveloperMessage,
    NamedToolChoice,
    Tool,
    ToolMessage,
)
from api.protocol.messages import ToolChoice as ChatToolChoice
from toolparsers import ToolCall


def conversation(messages: Sequence[ChatMessage]) -> tuple[Message, ...]:
    """The messages as the chat template sees them: list content becomes its text parts joined
    by newlines; `developer` is rendered as `system` (templates do not know the role)."""
    return tuple(_message(m) for m in messages)


def _message(message: ChatMessage) -> Message:
    role = "system" if isinstance(message, DeveloperMessage) else message.role
    calls: tuple[ToolCall, ...] = ()
    if isinstance(message, AssistantMessage) and message.tool_calls:
        calls = tuple(
            ToolCall(id=call.id, name=call.function.name, arguments=call.function.arguments)
            for call in message.tool_calls
        )
    return Message(
        role=role,
        content=_text_of(message.content),
        name=getattr(message, "name", None),
        tool_calls=calls,
        tool_call_id=message.tool_call_id if isinstance(message, ToolMessage) else None,
    )


def _text_of(content: str | list[ContentPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text or "" for part in content)


def tool_inputs(
    tools: Sequence[Tool] | None, tool_choice: ChatToolChoice | None, parallel_tool_calls: bool | None
) -> ToolInputs:
    """Chat `tools` / `tool_choice` / `parallel_tool_calls`; schema paths read
    `tools[i].function.parameters`."""
    return ToolInputs(
        tools=tuple(
            ToolInput(
                name=tool.function.name,
                parameters_param=f"tools[{i}].function.parameters",
                description=tool.function.description,
                parameters=tool.function.parameters,
                strict=tool.function.strict,
            )
            for i, tool in enumerate(tools or ())
        ),
        tool_choice=_choice(tool_choice),
        parallel_tool_calls=parallel_tool_calls,
    )


def _choice(choice: ChatToolChoice | None) -> ToolChoice | None:
    if isinstance(choice, NamedToolChoice):
        return NamedTool(choice.function.name)
    return choice

"""Chat messages -> prompt token ids through the tokenizer's own chat template (or the override).

The rendered text is encoded without adding special tokens: templates write BOS themselves where
the model wants one, so adding it again would double it. Rendering runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from api.chat_template_select import conversation_uses_tools, pick_chat_template
from api.http.errors import InvalidRequest
from api.protocol.messages import (
    AssistantMessage,
    ChatMessage,
    ContentPart,
    DeveloperMessage,
    Tool,
    ToolMessage,
)

# keys the server sets itself; chat_template_kwargs may not override them
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "chat_template",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "return_dict",
        "return_tensors",
        "tokenizer_kwargs",
    }
)


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """The rendered prompt text and its token ids."""

    text: str
    token_ids: list[int]


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """How to render: generation prompt or continuation of the last assistant message, extra
    template variables, the template override, whether to add special tokens when encoding, and
    the tool-call format whose shipped template renders tools the tokenizer's template ignores.
    `prompt_param` names the request field holding the conversation in 400s ("input" on /v1/responses)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None
    add_special_tokens: bool = False
    tool_call_parser: str | None = None
    prompt_param: str = "messages"


async def render_chat_prompt(
    tokenizer: Any, messages: Sequence[ChatMessage], tools: Sequence[Tool] | None, options: RenderOptions
) -> ChatPrompt:
    """Render `messages` (and `tools`) with the chat template and encode the text, off the event loop.

    The template is chosen by `api/chat_template_select.py` (override, the tokenizer's own, or the
    shipped tool template when tools are involved and the tokenizer's template ignores them).

    Raises InvalidRequest when there is no template, the options conflict, or the template rejects
    the conversation (e.g. roles that do not alternate).
    """
    if options.add_generation_prompt and options.continue_final_message:
        raise InvalidRequest(
            "add_generation_prompt and continue_final_message cannot both be true",
            param="continue_final_message",
        )
    if options.continue_final_message and not isinstance(messages[-1], AssistantMessage):
        raise InvalidRequest(
            "continue_final_message needs an assistant message last", param=options.prompt_param
        )
    if options.chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest(
            "this model has no chat template; start the server with --chat-template or use /v1/completions",
            param=options.prompt_param,
        )
    conversation = [message_to_template_dict(m) for m in messages]
    tool_dicts = [t.model_dump(exclude_none=True) for t in tools] if tools else None
    uses_tools = bool(tools) or conversation_uses_tools(messages)
    return await asyncio.to_thread(
        _render_and_encode, tokenizer, conversation, tool_dicts, uses_tools, options
    )


def message_to_template_dict(message: ChatMessage) -> dict[str, Any]:
    """The plain dict a Jinja chat template expects for one message.

    List content becomes its text parts joined by newlines; `developer` is rendered as `system`;
    tool-call arguments are parsed into objects (templates apply `tojson` to them).
    """
    role = "system" if isinstance(message, DeveloperMessage) else message.role
    result: dict[str, Any] = {"role": role, "content": _text_of(message.content)}
    if getattr(message, "name", None):
        result["name"] = message.name  # type: ignore[union-attr]
    if isinstance(message, AssistantMessage) and message.tool_calls:
        result["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "function": {
                    "name": call.function.name,
                    "arguments": _parsed_arguments(call.function.arguments),
                },
            }
            for call in message.tool_calls
        ]
    if isinstance(message, ToolMessage):
        result["tool_call_id"] = message.tool_call_id
    return result


def _text_of(content: str | list[ContentPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(part.text or "" for part in content)


def _parsed_arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _render_and_encode(
    tokenizer: Any,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    uses_tools: bool,
    options: RenderOptions,
) -> ChatPrompt:
    template = pick_chat_template(
        getattr(tokenizer, "chat_template", None), options.chat_template, uses_tools, options.tool_call_parser
    )
    extra = {
        k: v for k, v in (options.chat_template_kwargs or {}).items() if k not in _RESERVED_TEMPLATE_KWARGS
    }
    try:
        text = tokenizer.apply_chat_template(
            conversation,
            tools=tools,
            chat_template=template,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            tokenize=False,
            **extra,
        )
    except jinja2.TemplateError as exc:
        raise InvalidRequest(
            f"the chat template rejected the messages: {exc}", param=options.prompt_param
        ) from None
    token_ids = list(tokenizer.encode(text, add_special_tokens=options.add_special_tokens))
    return ChatPrompt(text=text, token_ids=token_ids)

"""The one place a prompt is made: chat template choice, render, encode (chat, Responses, /tokenize).

The rendered text is encoded without adding special tokens unless asked: templates write BOS
themselves where the model wants one, so adding it again would double it. Tools are rendered
exactly when generation constrains or parses calls (`constraints.renders_tools`), so /tokenize
counts the prompt that chat sends. Rendering runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import jinja2

from api.config import ServerConfig
from api.errors import InvalidRequest
from api.generation.constraints import renders_tools
from api.generation.inputs import GenerationInputs, Message, RenderOptions
from api.generation.template_select import conversation_uses_tools, pick_chat_template

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


async def render_prompt(tokenizer: Any, config: ServerConfig, inputs: GenerationInputs) -> ChatPrompt:
    """`render_prompt_sync` in a worker thread, off the event loop."""
    return await asyncio.to_thread(render_prompt_sync, tokenizer, config, inputs)


def render_prompt_sync(tokenizer: Any, config: ServerConfig, inputs: GenerationInputs) -> ChatPrompt:
    """Render `inputs.messages` (and its tools, when generation uses them) with the chat template
    and encode the text. Blocks for the template and the tokenizer: call it from a worker thread.

    The template is chosen by `template_select.pick_chat_template` (`config.chat_template`, the
    tokenizer's own, or the shipped tool template of `config.tool_call_parser` when tools are
    involved and the tokenizer's template ignores them).

    Raises InvalidRequest when there is no template, the options conflict, or the template rejects
    the conversation (e.g. roles that do not alternate), and the 400s of the tool_choice rule
    (`constraints.renders_tools`).
    """
    options = inputs.render
    messages = inputs.messages
    if options.add_generation_prompt and options.continue_final_message:
        raise InvalidRequest(
            "add_generation_prompt and continue_final_message cannot both be true",
            param="continue_final_message",
        )
    if options.continue_final_message and messages[-1].role != "assistant":
        raise InvalidRequest(
            "continue_final_message needs an assistant message last", param=options.prompt_param
        )
    if config.chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest(
            "this model has no chat template; start the server with --chat-template or use /v1/completions",
            param=options.prompt_param,
        )
    conversation = [template_dict(m) for m in messages]
    tools = inputs.tools.tools if renders_tools(inputs.tools) else ()
    tool_dicts = [tool.template_dict() for tool in tools] or None
    template = _Template(config.chat_template, config.tool_call_parser, bool(tools) or conversation_uses_tools(messages))
    return _render_and_encode(tokenizer, conversation, tool_dicts, template, options)


def template_dict(message: Message) -> dict[str, Any]:
    """The plain dict a Jinja chat template expects for one message; tool-call arguments are
    parsed into objects (templates apply `tojson` to them)."""
    result: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.name:
        result["name"] = message.name
    if message.role == "assistant" and message.tool_calls:
        result["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _parsed_arguments(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        result["tool_call_id"] = message.tool_call_id
    return result


def _parsed_arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


@dataclass(frozen=True, slots=True)
class _Template:
    """What picks the template: the override, the tool-call format, whether tools are involved."""

    override: str | None
    tool_call_parser: str | None
    uses_tools: bool


def _render_and_encode(
    tokenizer: Any,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template: _Template,
    options: RenderOptions,
) -> ChatPrompt:
    source = pick_chat_template(
        getattr(tokenizer, "chat_template", None), template.override, template.uses_tools, template.tool_call_parser
    )
    extra = {
        k: v for k, v in (options.chat_template_kwargs or {}).items() if k not in _RESERVED_TEMPLATE_KWARGS
    }
    try:
        text = tokenizer.apply_chat_template(
            conversation,
            tools=tools,
            chat_template=source,
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

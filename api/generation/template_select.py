"""Which chat template renders a conversation: the `--chat-template` override, the tokenizer's own,
or, when tools are involved and the tokenizer's template ignores them (SmolLM2's), the tool-aware
template the project ships for the server's tool-call format.

"Tools are involved" means the request renders `tools`, or its history holds assistant messages
with `tool_calls` or `role: "tool"` results; a template "ignores tools" when its source never
mentions `tools` (then it would silently drop the tool list and the calls from the prompt).
"""

from __future__ import annotations

from collections.abc import Sequence

from api.generation.inputs import Message
from toolparsers.templates import template_path

# tool-call parser name -> the shipped template (toolparsers/templates/NAME.jinja) written for its format
TOOL_TEMPLATES: dict[str, str] = {"hermes": "hermes_tools"}


def conversation_uses_tools(messages: Sequence[Message]) -> bool:
    """True when the history has an assistant message with tool calls or a tool result."""
    return any(m.role == "tool" or (m.role == "assistant" and bool(m.tool_calls)) for m in messages)


def template_mentions_tools(template: str | dict[str, str] | None) -> bool:
    """Whether a tokenizer's chat template (one source, or a dict of named sources) reads `tools`."""
    if isinstance(template, dict):
        return any("tools" in source for source in template.values())
    return bool(template) and "tools" in template  # type: ignore[operator]


def pick_chat_template(
    tokenizer_template: str | dict[str, str] | None,
    override: str | None,
    uses_tools: bool,
    tool_call_parser: str | None,
) -> str | None:
    """The template text to render with; None means the tokenizer's own.

    Reads the shipped template file when it is chosen (call it off the event loop).
    """
    if override is not None:
        return override
    if not uses_tools or template_mentions_tools(tokenizer_template):
        return None
    name = TOOL_TEMPLATES.get(tool_call_parser or "")
    if name is None:
        return None
    return template_path(name).read_text(encoding="utf-8")

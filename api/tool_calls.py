"""Parser results -> the OpenAI tool-call shapes of a whole chat.completion message."""

from __future__ import annotations

from collections.abc import Callable

from api.protocol.messages import FunctionCall, ToolCall
from toolparsers import ToolCall as ParsedCall
from toolparsers import ToolParser

ToolCallObserver = Callable[[list[ParsedCall]], None]
"""Called with the calls completed in each parsed piece of output (api/observability/tool_call_metrics.py counts them)."""


def message_tool_calls(calls: list[ParsedCall]) -> list[ToolCall]:
    """`message.tool_calls` entries: id "call_...", type "function", name, arguments (JSON text)."""
    return [
        ToolCall(id=call.id, type="function", function=FunctionCall(name=call.name, arguments=call.arguments))
        for call in calls
    ]


def split_tool_calls(
    parser: ToolParser, text: str, on_calls: ToolCallObserver | None = None, cut: bool = False
) -> tuple[str | None, list[ToolCall]]:
    """(content, tool_calls) of one choice's whole output text; `on_calls` sees the parsed calls.

    Content is None when calls were made and no other text was written; text that is not a
    well-formed call stays in the content verbatim (never dropped, never an error).
    """
    result = parser.parse(text, cut)
    if on_calls is not None and result.tool_calls:
        on_calls(result.tool_calls)
    calls = message_tool_calls(result.tool_calls)
    content = result.content if result.content or not calls else None
    return content, calls


def finish_reason_with_calls(engine_reason: str | None, made_calls: bool) -> str | None:
    """ "tool_calls" when the choice made calls (the engine ends a forced call with "stop"; a further
    call cut off by max_tokens is dropped, so the calls returned are whole), else the engine's
    reason ("stop", "length"), as vLLM reports it."""
    return "tool_calls" if made_calls else engine_reason

"""The one place where a request's output constraints (response_format, structured_outputs,
tools + tool_choice) become a GrammarSpec for the engine.

Grammar-constrained decoding is not wired yet: every constraining field is a 400 that says so.
"""

from __future__ import annotations

from api.errors import InvalidRequest, NotSupported
from api.protocol.chat_request import ChatCompletionRequest
from api.protocol.messages import NamedToolChoice, ResponseFormatText
from api.protocol.sampling_fields import SamplingFields
from constrained.spec import GrammarSpec


def grammar_spec_for_chat(request: ChatCompletionRequest) -> GrammarSpec | None:
    """The constraint of a chat request, or None for free text.

    Raises InvalidRequest for an inconsistent tool_choice and NotSupported (400) for
    response_format json_object/json_schema, structured_outputs, and tools with a tool_choice
    other than "none".
    """
    _check_tool_choice(request)
    if request.tools and request.tool_choice != "none":
        raise NotSupported(
            'tool calling is not supported yet: send tool_choice "none" or no tools', param="tool_choice"
        )
    return _grammar_spec_for_format(request)


def grammar_spec_for_completion(request: SamplingFields) -> GrammarSpec | None:
    """The constraint of a /v1/completions request (response_format, structured_outputs), or None."""
    return _grammar_spec_for_format(request)


def _grammar_spec_for_format(request: SamplingFields) -> GrammarSpec | None:
    if request.structured_outputs is not None:
        raise NotSupported("structured_outputs is not supported yet", param="structured_outputs")
    fmt = request.response_format
    if fmt is not None and not isinstance(fmt, ResponseFormatText):
        raise NotSupported(f"response_format type '{fmt.type}' is not supported yet", param="response_format")
    return None


def _check_tool_choice(request: ChatCompletionRequest) -> None:
    choice = request.tool_choice
    if choice in (None, "none", "auto"):
        return
    if not request.tools:
        raise InvalidRequest("tool_choice is only allowed when tools are given", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in {
        t.function.name for t in request.tools
    }:
        raise InvalidRequest(
            f"tool_choice names '{choice.function.name}', which is not in tools", param="tool_choice"
        )

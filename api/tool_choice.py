"""A request's tools, tool_choice and output format -> its grammar and how its output is parsed.

| tool_choice | tools in the prompt | grammar | output parsed for calls |
| --- | --- | --- | --- |
| none (or no tools) | no | the format's, if any | no |
| auto (default with tools) | yes | free text + calls constrained once the format's marker appears (`--no-constrain-auto-tools`: none) | yes |
| required / named | yes | the call is forced (named: exactly that function, one call) | yes |

`parallel_tool_calls: false` allows one call. With a JSON `response_format` (or structured_outputs
json / json_object), "auto" means: either the JSON answer or tool calls (`api/tool_format_grammar.py`);
any other format with "auto", and any format with a forced call, is a 400 conflict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from api.config import ServerConfig
from api.http.errors import InvalidRequest, NotSupported
from api.grammar_from_request import RequestGrammar, format_grammar, with_options
from api.json_schema_check import check_json_schema
from api.protocol.chat_request import ChatCompletionRequest
from api.protocol.messages import NamedToolChoice, Tool
from api.protocol.messages import ToolChoice as ToolChoiceField
from api.protocol.structured_outputs import StructuredOutputs
from api.tool_format_grammar import answer_or_calls_grammar
from engine import SamplingParams
from toolparsers import ToolParser, ToolSpec, get_tool_parser
from toolparsers.base import ToolChoice

# Parsers whose call marker is a control token: the detokenizer must keep special tokens.
_PARSERS_KEEPING_SPECIAL_TOKENS = frozenset({"mistral"})
_TOOLS_PARAM = "tools"


@dataclass(frozen=True, slots=True)
class ToolCalling:
    """How one request's output is split into content and tool calls: the parser and the tools."""

    parser_class: type[ToolParser]
    tools: tuple[ToolSpec, ...]

    def new_parser(self) -> ToolParser:
        """A fresh parser: the streaming state of one choice (or a whole-output parse)."""
        return self.parser_class(list(self.tools))


@dataclass(frozen=True, slots=True)
class ChatConstraints:
    """What a chat request's tools and format mean for rendering, generation and the answer.

    `grammar` None: free text. `tool_calling` None: the output is all content. `render_tools`:
    pass `tools` to the chat template. `keep_special_tokens`: detokenize with special tokens.
    `close_grammar`: end the constrained output before max_tokens cuts it (EngineRequest.close_grammar).
    """

    grammar: RequestGrammar | None
    tool_calling: ToolCalling | None = None
    render_tools: bool = False
    keep_special_tokens: bool = False
    close_grammar: bool = False


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """The tool fields of one request in chat shapes (the Responses endpoint converts its own).

    `parameters_param` formats the field path of `tools[index]`'s schema for 400s.
    """

    tools: Sequence[Tool] | None = None
    tool_choice: ToolChoiceField | None = None
    parallel_tool_calls: bool | None = None
    structured_outputs: StructuredOutputs | None = None
    parameters_param: str = "tools[{index}].function.parameters"


def chat_constraints(request: ChatCompletionRequest, config: ServerConfig) -> ChatConstraints:
    """Decide grammar, parsing and tool rendering for a chat request (see `request_constraints`)."""
    tools = ToolRequest(
        request.tools, request.tool_choice, request.parallel_tool_calls, request.structured_outputs
    )
    return request_constraints(format_grammar(request), tools, config)


def request_constraints(
    fmt: RequestGrammar | None, request: ToolRequest, config: ServerConfig
) -> ChatConstraints:
    """Decide grammar, parsing and tool rendering from the output format `fmt` and the tool fields
    (see the module table).

    Raises InvalidRequest / NotSupported (400) for a tool_choice without tools, "auto" when the
    server disables it, a forced choice with a format, a malformed tool schema, and
    ToolParserError (400, param tool_choice) for a named function that is not in `tools`.
    """
    choice = _effective_choice(request)
    if choice == "none":
        return ChatConstraints(grammar=fmt, close_grammar=fmt is not None and config.close_structured_outputs)
    assert request.tools
    if choice == "auto" and not config.enable_auto_tool_choice:
        raise NotSupported(
            'tool_choice "auto" is disabled on this server (--no-enable-auto-tool-choice); '
            'send "required", a named function or "none"',
            param="tool_choice",
        )
    parser_class = get_tool_parser(config.tool_call_parser)
    specs = [
        tool_spec(tool, request.parameters_param.format(index=i)) for i, tool in enumerate(request.tools)
    ]
    parallel = request.parallel_tool_calls is not False
    tool_grammar = parser_class(specs).grammar_for(specs, _parser_choice(choice), parallel)
    if tool_grammar is not None:
        # Arguments objects are closed: a schema that does not say otherwise gets only its declared
        # keys, so a small model cannot invent keys until max_tokens cuts the call.
        tool_grammar = dataclasses.replace(with_options(tool_grammar, request.structured_outputs),
                                           additional_properties=False)
    if choice != "auto":
        if fmt is not None:
            raise InvalidRequest(
                f"{fmt.param} cannot be combined with a forced tool_choice: the call is the whole answer",
                param=_field_of(fmt.param),
            )
        grammar = RequestGrammar(tool_grammar, _TOOLS_PARAM) if tool_grammar is not None else None
        close = config.close_tool_calls
    elif fmt is not None:
        grammar = fmt
        close = config.close_structured_outputs
        if config.constrain_auto_tools and tool_grammar is not None:
            grammar = RequestGrammar(answer_or_calls_grammar(fmt, tool_grammar), fmt.param)
            close = config.close_structured_outputs and config.close_tool_calls
    elif config.constrain_auto_tools and tool_grammar is not None:
        grammar = RequestGrammar(tool_grammar, _TOOLS_PARAM)
        close = config.close_tool_calls
    else:
        grammar, close = None, False
    return ChatConstraints(
        grammar=grammar,
        tool_calling=ToolCalling(parser_class, tuple(specs)),
        render_tools=True,
        keep_special_tokens=config.tool_call_parser in _PARSERS_KEEPING_SPECIAL_TOKENS,
        close_grammar=close,
    )


def tool_spec(tool: Tool, parameters_param: str) -> ToolSpec:
    """The parser-side ToolSpec of one tool; its parameters schema is checked (400 naming
    `parameters_param` when malformed)."""
    function = tool.function
    if function.parameters is None:
        return ToolSpec(
            name=function.name, description=function.description or "", strict=bool(function.strict)
        )
    check_json_schema(function.parameters, parameters_param)
    return ToolSpec(
        name=function.name,
        description=function.description or "",
        parameters=_closed_if_parameterless(function.parameters),
        strict=bool(function.strict),
    )


# Keys that leave an object schema without any parameter (and without a way to add one).
_PARAMETERLESS_KEYS = frozenset({"type", "properties", "required", "title", "description", "$schema"})


def _closed_if_parameterless(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with `additionalProperties: false` when it declares no parameter at all
    (`{"type": "object", "properties": {}}`, the usual way to write a function without arguments):
    the call then takes only `{}`, as when `parameters` is left out. Left open, the grammar lets
    the model invent keys until max_tokens cuts the call (case 004)."""
    if (
        schema.get("type", "object") == "object"
        and not schema.get("properties")
        and not schema.get("required")
        and set(schema) <= _PARAMETERLESS_KEYS
    ):
        return {**schema, "type": "object", "properties": {}, "additionalProperties": False}
    return schema


def sampling_for_tools(constraints: ChatConstraints, params: SamplingParams) -> SamplingParams:
    """`params` with skip_special_tokens False when the tool parser needs its control-token markers."""
    if constraints.keep_special_tokens and constraints.tool_calling is not None:
        return dataclasses.replace(params, skip_special_tokens=False)
    return params


def _effective_choice(request: ToolRequest) -> str | NamedToolChoice:
    choice = request.tool_choice
    if choice is None:
        return "auto" if request.tools else "none"
    if request.tools:
        return choice
    if choice in ("none", "auto"):
        return "none"
    raise InvalidRequest("tool_choice is only allowed when tools are given", param="tool_choice")


def _parser_choice(choice: str | NamedToolChoice) -> ToolChoice:
    if isinstance(choice, NamedToolChoice):
        return {"type": "function", "function": {"name": choice.function.name}}
    return choice  # type: ignore[return-value]


def _field_of(param: str) -> str:
    """The top-level request field of a param path ("structured_outputs.json" -> "structured_outputs")."""
    return param.split(".", 1)[0]

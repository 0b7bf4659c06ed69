"""A /v1/responses request's tools, tool_choice, text.format and sampling fields -> the chat shapes
the shared code takes (`api/tool_choice.py`, `api/grammar_from_request.py`): the same grammars,
tool parsing and 400s as /v1/chat/completions, with Responses field names in `param`."""

from __future__ import annotations

from api.config import ServerConfig
from api.grammar_from_request import response_format_grammar
from api.protocol.messages import (
    FunctionDefinition,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    ResponseFormatText,
    Tool,
    ToolChoice,
)
from api.protocol.responses_request import (
    FunctionTool,
    FunctionToolChoice,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from api.tool_choice import ChatConstraints, ToolRequest, request_constraints
from engine import SamplingParams


def chat_tools(body: ResponsesRequest) -> list[Tool] | None:
    """`tools` as chat function tools (validation has already refused every other tool type)."""
    if body.tools is None:
        return None
    tools = []
    for tool in body.tools:
        assert isinstance(tool, FunctionTool)
        definition = FunctionDefinition(
            name=tool.name, description=tool.description, parameters=tool.parameters, strict=tool.strict
        )
        tools.append(Tool(type="function", function=definition))
    return tools


def chat_tool_choice(body: ResponsesRequest) -> ToolChoice | None:
    """`tool_choice` in chat shape: the mode string, or a NamedToolChoice for a function."""
    choice = body.tool_choice
    if isinstance(choice, FunctionToolChoice):
        return NamedToolChoice(type="function", function=NamedFunction(name=choice.name))
    return choice  # type: ignore[return-value]


def chat_format(body: ResponsesRequest) -> ResponseFormat | None:
    """`text.format` as a chat response_format (None: no format)."""
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, TextFormatJsonSchema):
        schema = JsonSchemaFormat(
            name=fmt.name, description=fmt.description, schema=fmt.json_schema, strict=fmt.strict
        )
        return ResponseFormatJsonSchema(type="json_schema", json_schema=schema)
    if isinstance(fmt, TextFormatJsonObject):
        return ResponseFormatJsonObject(type="json_object")
    return ResponseFormatText(type="text") if fmt is not None else None


def responses_constraints(body: ResponsesRequest, config: ServerConfig) -> ChatConstraints:
    """Grammar, tool parsing and tool rendering of a Responses request (see `request_constraints`).

    Raises the same 400s as chat; schema paths read `text.format.schema` and `tools[i].parameters`.
    """
    fmt = response_format_grammar(chat_format(body), field="text.format", schema_param="text.format.schema")
    tools = ToolRequest(
        tools=chat_tools(body),
        tool_choice=chat_tool_choice(body),
        parallel_tool_calls=body.parallel_tool_calls,
        parameters_param="tools[{index}].parameters",
    )
    return request_constraints(fmt, tools, config)


def responses_sampling(body: ResponsesRequest, max_tokens: int) -> SamplingParams:
    """SamplingParams of a Responses request: temperature, top_p, seed, stop; defaults for nulls."""
    return SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        seed=body.seed,
        max_tokens=max_tokens,
        stop=body.stop_list(),
    )

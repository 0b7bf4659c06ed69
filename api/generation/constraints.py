"""A request's output format, tools, tool_choice and parallel_tool_calls -> one grammar, and how
its output is read.

| tool_choice | tools in the prompt | grammar | output parsed for calls |
| --- | --- | --- | --- |
| none (or no tools) | no | the format's, if any | no |
| auto (default with tools) | yes | free text + calls constrained once the format's marker appears (`--no-constrain-auto-tools`: none) | yes |
| required / named | yes | the call is forced (named: exactly that function, one call) | yes |

`parallel_tool_calls: false` allows one call. With a JSON format (response_format / text.format
json_schema or json_object, structured_outputs json / json_object), "auto" means: either the JSON
answer or tool calls (`constrained.compose.answer_or_calls` over the parser's typed
`call_grammar`); any other format with "auto", and any format with a forced call, is a 400 conflict. Each grammar keeps the request field it came from
(`RequestGrammar.param`: the format's field, or "tools").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from api.config import ServerConfig
from api.errors import InvalidRequest, NotSupported
from api.generation.inputs import (
    FunctionTool,
    GenerationInputs,
    GrammarOptions,
    NamedTool,
    RequestGrammar,
    ToolChoice,
    ToolInputs,
)
from api.generation.json_schema_check import check_json_schema
from constrained.compose import answer_or_calls
from constrained.errors import NotComposable
from constrained.registry import GRAMMAR_BACKENDS
from constrained.spec import GrammarKind, GrammarSpec
from engine import SamplingParams
from toolparsers import ToolParser, ToolSpec, get_tool_parser
from toolparsers.base import ToolChoice as ParserToolChoice

# Parsers whose call marker is a control token: the detokenizer must keep special tokens.
_PARSERS_KEEPING_SPECIAL_TOKENS = frozenset({"mistral"})
_TOOLS_PARAM = "tools"
_AUTO_BACKEND = "auto"


@dataclass(frozen=True, slots=True)
class ToolCalling:
    """How one request's output is split into content and tool calls: the parser, the tools, and
    whether tool_choice forces the call ("required" / named; a call left open at the end is then
    dropped, never content: `api/generation/ending.py`)."""

    parser_class: type[ToolParser]
    tools: tuple[ToolSpec, ...]
    forced: bool = False
    constrained: bool = False   # the grammar constrains the calls: a call's header goes out once its name is decided

    def new_parser(self) -> ToolParser:
        """A fresh parser: the streaming state of one choice (or a whole-output parse)."""
        return self.parser_class(list(self.tools), constrained=self.constrained)


@dataclass(frozen=True, slots=True)
class Constraints:
    """What a request's tools and format mean for rendering, generation and the answer.

    `grammar` None: free text. `tool_calling` None: the output is all content. `keep_special_tokens`:
    detokenize with special tokens. `close_grammar`: end the constrained output before max_tokens
    cuts it (EngineRequest.close_grammar).
    """

    grammar: RequestGrammar | None
    tool_calling: ToolCalling | None = None
    keep_special_tokens: bool = False
    close_grammar: bool = False

    @property
    def grammar_param(self) -> str | None:
        """The request field the grammar came from (None without a grammar)."""
        return self.grammar.param if self.grammar is not None else None

    def sampling(self, params: SamplingParams) -> SamplingParams:
        """`params` with skip_special_tokens False when the tool parser needs its control-token markers."""
        if self.keep_special_tokens and self.tool_calling is not None:
            return dataclasses.replace(params, skip_special_tokens=False)
        return params


def renders_tools(tools: ToolInputs) -> bool:
    """Whether the chat template gets `tools`: there are tools and tool_choice is not "none".

    Raises InvalidRequest(param tool_choice) for "required" or a named function without tools.
    """
    return effective_tool_choice(tools) != "none"


def effective_tool_choice(tools: ToolInputs) -> ToolChoice:
    """tool_choice with its default filled in: "auto" with tools, "none" without.

    Raises InvalidRequest(param tool_choice) for "required" or a named function without tools.
    """
    choice = tools.tool_choice
    if choice is None:
        return "auto" if tools.tools else "none"
    if tools.tools:
        return choice
    if choice in ("none", "auto"):
        return "none"
    raise InvalidRequest("tool_choice is only allowed when tools are given", param="tool_choice")


def request_constraints(inputs: GenerationInputs, config: ServerConfig) -> Constraints:
    """Decide grammar and parsing from the output format and the tool fields (see the module table).
    Walks client schemas: call it off the event loop.

    Raises InvalidRequest / NotSupported (400) for a tool_choice without tools, "auto" when the
    server disables it, a forced choice with a format, a malformed tool schema, an unknown
    backend, and ToolParserError (400, param tool_choice) for a named function not in `tools`.
    """
    fmt = inputs.output_format
    choice = effective_tool_choice(inputs.tools)
    if choice == "none":
        return Constraints(grammar=fmt, close_grammar=fmt is not None and config.close_structured_outputs)
    if choice == "auto" and not config.enable_auto_tool_choice:
        raise NotSupported(
            'tool_choice "auto" is disabled on this server (--no-enable-auto-tool-choice); '
            'send "required", a named function or "none"',
            param="tool_choice",
        )
    parser_class = get_tool_parser(config.tool_call_parser)
    specs = [tool_spec(tool) for tool in inputs.tools.tools]
    parallel = inputs.tools.parallel_tool_calls is not False
    parser = parser_class(specs)
    if choice == "auto" and fmt is not None and config.constrain_auto_tools:
        grammar = _answer_or_calls(fmt, parser, specs, parallel)
        close = config.close_structured_outputs and config.close_tool_calls
    else:
        grammar, close = _tool_grammar(fmt, parser.grammar_for(specs, _parser_choice(choice), parallel),
                                       inputs.grammar_options, choice, config)
    constrained = grammar is not None and (choice != "auto" or config.constrain_auto_tools)
    return Constraints(
        grammar=grammar,
        tool_calling=ToolCalling(parser_class, tuple(specs), forced=choice != "auto", constrained=constrained),
        keep_special_tokens=config.tool_call_parser in _PARSERS_KEEPING_SPECIAL_TOKENS,
        close_grammar=close,
    )


def _answer_or_calls(fmt: RequestGrammar, parser: ToolParser, specs: list[ToolSpec], parallel: bool) -> RequestGrammar:
    """tool_choice "auto" with a JSON format: either `fmt`'s JSON answer or the parser's calls,
    never anything else (what OpenAI does with `tools` + a json_schema `response_format`; the
    openai-agents SDK sends both when an agent has tools and an output type). The calls' arguments
    are closed (`answer_or_calls`); the result takes `fmt`'s backend and JSON options.

    Raises InvalidRequest when `fmt` is not a JSON format, NotSupported when the tool-call format
    is not written as structural tags (pythonic); both name the format's request field.
    """
    field = _field_of(fmt.param)
    try:
        calls = parser.call_grammar(specs, "auto", parallel)
        assert calls is not None, "auto with tools always has calls"
        return RequestGrammar(answer_or_calls(fmt.spec, calls), fmt.param)
    except NotComposable as exc:
        if exc.part == "answer":
            raise InvalidRequest(
                f"{fmt.param} ({fmt.spec.kind.value}) cannot be combined with tools under tool_choice "
                '"auto"; use a JSON schema or json_object format, or tool_choice "none"',
                param=field,
            ) from exc
        raise NotSupported(
            f"{fmt.param} cannot be combined with tools in this server's tool-call format; "
            'use tool_choice "none" or drop the format',
            param=field,
        ) from exc


def _tool_grammar(
    fmt: RequestGrammar | None, tool_grammar: GrammarSpec | None, options: GrammarOptions | None,
    choice: ToolChoice, config: ServerConfig
) -> tuple[RequestGrammar | None, bool]:
    """The request's grammar and whether to close it, for a choice other than "none", unless
    "auto" joins a JSON format with the calls (`_answer_or_calls`)."""
    if tool_grammar is not None:
        # Arguments objects are closed: a schema that does not say otherwise gets only its declared
        # keys, so a small model cannot invent keys until max_tokens cuts the call.
        tool_grammar = dataclasses.replace(with_options(tool_grammar, options), additional_properties=False)
    if choice != "auto":
        if fmt is not None:
            raise InvalidRequest(
                f"{fmt.param} cannot be combined with a forced tool_choice: the call is the whole answer",
                param=_field_of(fmt.param),
            )
        grammar = RequestGrammar(tool_grammar, _TOOLS_PARAM) if tool_grammar is not None else None
        return grammar, config.close_tool_calls
    if fmt is not None:
        return fmt, config.close_structured_outputs
    if config.constrain_auto_tools and tool_grammar is not None:
        return RequestGrammar(tool_grammar, _TOOLS_PARAM), config.close_tool_calls
    return None, False


def tool_spec(tool: FunctionTool) -> ToolSpec:
    """The parser-side ToolSpec of one tool; its parameters schema is checked (400 naming
    `tool.parameters_param` when malformed)."""
    if tool.parameters is None:
        return ToolSpec(name=tool.name, description=tool.description or "", strict=bool(tool.strict))
    check_json_schema(tool.parameters, tool.parameters_param)
    return ToolSpec(
        name=tool.name,
        description=tool.description or "",
        parameters=_closed_if_parameterless(tool.parameters),
        strict=bool(tool.strict),
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


def json_schema_grammar(schema: dict[str, Any], param: str) -> RequestGrammar:
    """A json_schema grammar for a checked `schema` (see `json_schema_check.py`); JSON schemas
    travel as compact JSON text with their key order kept (the order of `properties` is the order
    in which the model writes the keys). Raises InvalidRequest(param) for a malformed schema."""
    check_json_schema(schema, param)
    source = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return RequestGrammar(GrammarSpec(GrammarKind.JSON_SCHEMA, source), param)


def json_object_grammar(param: str) -> RequestGrammar:
    """Any JSON object (response_format json_object), named `param` in 400s."""
    return RequestGrammar(GrammarSpec(GrammarKind.JSON_OBJECT, ""), param)


def grammar_backend(backend: str | None) -> str | None:
    """The backend a request asks for (None: the server's default, also for "auto").

    Raises InvalidRequest(param="structured_outputs.backend") naming the known backends.
    """
    if backend is None or backend == _AUTO_BACKEND:
        return None
    if backend not in GRAMMAR_BACKENDS:
        known = ", ".join([_AUTO_BACKEND, *sorted(GRAMMAR_BACKENDS)])
        raise InvalidRequest(
            f"unknown structured outputs backend {backend!r}; known: {known}",
            param="structured_outputs.backend",
        )
    return backend


def with_options(spec: GrammarSpec, options: GrammarOptions | None) -> GrammarSpec:
    """`spec` with the structured_outputs backend, whitespace and closed-object options applied."""
    if options is None:
        return spec
    return dataclasses.replace(
        spec,
        backend=options.backend,
        any_whitespace=options.any_whitespace,
        additional_properties=options.additional_properties,
    )


def _parser_choice(choice: ToolChoice) -> ParserToolChoice:
    if isinstance(choice, NamedTool):
        return {"type": "function", "function": {"name": choice.name}}
    return choice


def _field_of(param: str) -> str:
    """The top-level request field of a param path ("structured_outputs.json" -> "structured_outputs")."""
    return param.split(".", 1)[0]

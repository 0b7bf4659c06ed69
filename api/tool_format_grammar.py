"""tool_choice "auto" together with a JSON output format: the answer is either the JSON document
or tool calls in the parser's format, never anything else.

This is what OpenAI does with `tools` + a json_schema `response_format` (the openai-agents SDK sends
both when an agent has tools and an output type). constrained/compose.py builds the grammar (a
structural tag with an answer, which both grammar backends compile); this module only names the
request field at fault when the two cannot be joined.
"""

from __future__ import annotations

from api.errors import InvalidRequest, NotSupported
from api.generation.inputs import RequestGrammar
from constrained.compose import answer_or_calls_spec
from constrained.errors import NotComposable
from constrained.spec import GrammarSpec


def answer_or_calls_grammar(fmt: RequestGrammar, tool_grammar: GrammarSpec) -> GrammarSpec:
    """A structural_tag GrammarSpec allowing `fmt`'s JSON answer or the calls of `tool_grammar`
    (the parser's spec from `ToolParser.grammar_for`; its "forced" flag is ignored; its arguments
    stay closed when its `additional_properties` is False). The result takes `fmt`'s backend and
    JSON options.

    Raises InvalidRequest when `fmt` is not a JSON format, NotSupported when the tool-call format
    is not written as structural tags (pythonic); both name the format's request field.
    """
    field = fmt.param.split(".", 1)[0]
    try:
        return answer_or_calls_spec(fmt.spec, tool_grammar)
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

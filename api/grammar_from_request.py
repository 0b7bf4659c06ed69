"""A request's output format (OpenAI `response_format`, vLLM `structured_outputs`) -> GrammarSpec.

Both fields mean the same as in OpenAI / vLLM. At most one of them may constrain the output
(`response_format: {"type": "text"}` constrains nothing); a conflict, an unknown backend or a
malformed schema is a 400 naming the field. A requested format is never dropped: whatever cannot
be enforced is refused. JSON schemas travel as compact JSON text with their key order kept (the
order of `properties` is the order in which the model writes the keys).

Tools and `tool_choice` are combined with the format in `api/tool_choice.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from api.http.errors import InvalidRequest
from api.json_schema_check import check_json_schema, parse_schema_text
from api.protocol.messages import ResponseFormat, ResponseFormatJsonObject, ResponseFormatJsonSchema
from api.protocol.sampling_fields import SamplingFields
from api.protocol.structured_outputs import StructuredOutputs
from constrained.errors import GrammarError
from constrained.registry import GRAMMAR_BACKENDS
from constrained.spec import GrammarKind, GrammarSpec

_AUTO_BACKEND = "auto"


@dataclass(frozen=True, slots=True)
class RequestGrammar:
    """The constraint of one request and `param`, the request field it came from (named by the 400
    when a grammar backend cannot compile it)."""

    spec: GrammarSpec
    param: str


def format_grammar(request: SamplingFields) -> RequestGrammar | None:
    """The constraint of `response_format` or `structured_outputs`, with the structured_outputs
    options applied; None when neither constrains the output.

    Raises InvalidRequest when both constrain it, when a schema is missing or malformed, or when
    `structured_outputs.backend` is unknown.
    """
    from_format = response_format_grammar(request.response_format)
    outputs = request.structured_outputs
    from_outputs = _from_structured_outputs(outputs) if outputs is not None else None
    if from_format is not None and from_outputs is not None:
        raise InvalidRequest(
            f"response_format ({from_format.spec.kind.value}) and {from_outputs.param} both constrain the "
            "output; send only one of them",
            param=from_outputs.param,
        )
    grammar = from_format or from_outputs
    if grammar is None:
        check_options(outputs)
        return None
    return RequestGrammar(with_options(grammar.spec, outputs), grammar.param)


def grammar_spec_for_completion(request: SamplingFields) -> RequestGrammar | None:
    """The constraint of a /v1/completions request (response_format, structured_outputs), or None."""
    return format_grammar(request)


def with_options(spec: GrammarSpec, outputs: StructuredOutputs | None) -> GrammarSpec:
    """`spec` with `structured_outputs`' backend, disable_any_whitespace and
    disable_additional_properties applied. Raises InvalidRequest for an unknown backend."""
    if outputs is None:
        return spec
    return dataclasses.replace(
        spec,
        backend=check_options(outputs),
        any_whitespace=not outputs.disable_any_whitespace,
        additional_properties=not outputs.disable_additional_properties,
    )


def check_options(outputs: StructuredOutputs | None) -> str | None:
    """The backend `structured_outputs` asks for (None: the server's default, also for "auto").

    Raises InvalidRequest(param="structured_outputs.backend") naming the known backends.
    """
    backend = outputs.backend if outputs is not None else None
    if backend is None or backend == _AUTO_BACKEND:
        return None
    if backend not in GRAMMAR_BACKENDS:
        known = ", ".join([_AUTO_BACKEND, *sorted(GRAMMAR_BACKENDS)])
        raise InvalidRequest(
            f"unknown structured outputs backend {backend!r}; known: {known}",
            param="structured_outputs.backend",
        )
    return backend


@contextlib.contextmanager
def grammar_errors_name(grammar: RequestGrammar | None) -> Iterator[None]:
    """Within the block, a GrammarError (a backend could not compile the request's grammar) gets
    `param` = the request field the grammar came from, e.g. "response_format.json_schema.schema"."""
    try:
        yield
    except GrammarError as exc:
        if grammar is not None:
            exc.param = grammar.param
        raise


def json_schema_spec(schema: dict[str, Any], param: str) -> GrammarSpec:
    """A json_schema GrammarSpec for a checked `schema` (see `api/json_schema_check.py`)."""
    check_json_schema(schema, param)
    source = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    return GrammarSpec(GrammarKind.JSON_SCHEMA, source)


def response_format_grammar(
    fmt: ResponseFormat | None, field: str = "response_format", schema_param: str | None = None
) -> RequestGrammar | None:
    """The constraint of a chat-shaped output format (None for text or no format).

    `field` names the request field in 400s (json_object); `schema_param` the schema's path
    (default `{field}.json_schema.schema`). The Responses endpoint passes its `text.format` here.
    Raises InvalidRequest when a json_schema format has no schema or a malformed one.
    """
    if isinstance(fmt, ResponseFormatJsonObject):
        return RequestGrammar(GrammarSpec(GrammarKind.JSON_OBJECT, ""), field)
    if isinstance(fmt, ResponseFormatJsonSchema):
        param = schema_param or f"{field}.json_schema.schema"
        schema = fmt.json_schema.json_schema
        if schema is None:
            raise InvalidRequest(f"a json_schema format needs its schema in {param}", param=param)
        return RequestGrammar(json_schema_spec(schema, param), param)
    return None  # text, or no format


def _from_structured_outputs(outputs: StructuredOutputs) -> RequestGrammar | None:
    names = outputs.constraint_names()
    if not names:
        return None
    param = f"structured_outputs.{names[0]}"
    if outputs.json_ is not None:
        schema = outputs.json_
        if isinstance(schema, str):
            schema = parse_schema_text(schema, param)
        return RequestGrammar(json_schema_spec(schema, param), param)
    if outputs.regex is not None:
        return RequestGrammar(GrammarSpec(GrammarKind.REGEX, outputs.regex), param)
    if outputs.choice is not None:
        source = json.dumps(outputs.choice, ensure_ascii=False)
        return RequestGrammar(GrammarSpec(GrammarKind.CHOICE, source), param)
    if outputs.grammar is not None:
        return RequestGrammar(GrammarSpec(GrammarKind.GRAMMAR, outputs.grammar), param)
    if outputs.structural_tag is not None:
        tag = outputs.structural_tag
        if isinstance(tag, str):
            tag = parse_schema_text(tag, param)
        source = json.dumps(tag, separators=(",", ":"), ensure_ascii=False)
        return RequestGrammar(GrammarSpec(GrammarKind.STRUCTURAL_TAG, source), param)
    return RequestGrammar(GrammarSpec(GrammarKind.JSON_OBJECT, ""), param)  # json_object: true

"""The output-format fields of chat and completions (OpenAI `response_format`, vLLM
`structured_outputs`) -> the request's RequestGrammar and GrammarOptions.

Both fields mean the same as in OpenAI / vLLM. At most one of them may constrain the output
(`response_format: {"type": "text"}` constrains nothing); a conflict, an unknown backend or a
malformed schema is a 400 naming the field. A requested format is never dropped: whatever cannot
be enforced is refused. Tools and `tool_choice` are combined with the format in
`api/generation/constraints.py`.
"""

from __future__ import annotations

import dataclasses
import json

from api.errors import InvalidRequest
from api.generation.constraints import grammar_backend, json_object_grammar, json_schema_grammar, with_options
from api.generation.inputs import GrammarOptions, RequestGrammar
from api.generation.json_schema_check import parse_schema_text
from api.protocol.messages import ResponseFormat, ResponseFormatJsonObject, ResponseFormatJsonSchema
from api.protocol.sampling_fields import SamplingFields
from api.protocol.structured_outputs import StructuredOutputs
from constrained.spec import GrammarKind, GrammarSpec


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
    options = grammar_options(outputs)
    grammar = from_format or from_outputs
    if grammar is None:
        return None
    return dataclasses.replace(grammar, spec=with_options(grammar.spec, options))


def grammar_options(outputs: StructuredOutputs | None) -> GrammarOptions | None:
    """The options of `structured_outputs` (None without it).

    Raises InvalidRequest(param="structured_outputs.backend") for an unknown backend.
    """
    if outputs is None:
        return None
    return GrammarOptions(
        backend=grammar_backend(outputs.backend),
        any_whitespace=not outputs.disable_any_whitespace,
        additional_properties=not outputs.disable_additional_properties,
    )


def response_format_grammar(fmt: ResponseFormat | None) -> RequestGrammar | None:
    """The constraint of a chat `response_format` (None for text or no format).

    Raises InvalidRequest when a json_schema format has no schema or a malformed one.
    """
    if isinstance(fmt, ResponseFormatJsonObject):
        return json_object_grammar("response_format")
    if isinstance(fmt, ResponseFormatJsonSchema):
        param = "response_format.json_schema.schema"
        schema = fmt.json_schema.json_schema
        if schema is None:
            raise InvalidRequest(f"a json_schema format needs its schema in {param}", param=param)
        return json_schema_grammar(schema, param)
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
        return json_schema_grammar(schema, param)
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
    return json_object_grammar(param)  # json_object: true

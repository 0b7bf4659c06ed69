"""tool_choice "auto" together with a JSON output format: the answer is either the JSON document
or tool calls in the parser's format, never anything else.

This is what OpenAI does with `tools` + a json_schema `response_format` (the openai-agents SDK sends
both when an agent has tools and an output type). No structural tag says "this JSON, or calls", so
the two are joined in one Lark grammar for llguidance (which embeds JSON schemas with `%json`):

    start: answer | calls
    answer: %json {the format's schema}
    calls: call (SEPARATOR call)*            (just `call` when only one call is allowed)
    call: call_0 | call_1 | ...
    call_0: "BEGIN_0" %json {arguments schema of tool 0} "END_0"

The calls come from the parser's own forced (tool_choice "required") structural tag, so they match
what `grammar_for` would force; formats that are not JSON-in-tags (pythonic, qwen3_coder) are refused.
"""

from __future__ import annotations

import json
from typing import Any

from api.errors import InvalidRequest, NotSupported
from api.generation.inputs import RequestGrammar
from constrained.source import close_objects
from constrained.spec import GrammarKind, GrammarSpec, guidance_json_options

BACKEND = "guidance"
_JSON_KINDS = (GrammarKind.JSON_SCHEMA, GrammarKind.JSON_OBJECT)


def answer_or_calls_grammar(fmt: RequestGrammar, tool_grammar: GrammarSpec) -> GrammarSpec:
    """A Lark GrammarSpec (backend "guidance") allowing `fmt`'s JSON answer or the calls of
    `tool_grammar` (a structural tag from `ToolParser.grammar_for`; its "forced" flag is ignored).

    Raises InvalidRequest when `fmt` is not a JSON format or asks for another backend, NotSupported
    when the tool-call format cannot be written as JSON between literal tags.
    """
    field = fmt.param.split(".", 1)[0]
    if fmt.spec.kind not in _JSON_KINDS:
        raise InvalidRequest(
            f"{fmt.param} ({fmt.spec.kind.value}) cannot be combined with tools under tool_choice "
            '"auto"; use a JSON schema or json_object format, or tool_choice "none"',
            param=field,
        )
    if fmt.spec.backend not in (None, BACKEND):
        raise InvalidRequest(
            f"a JSON answer or tool calls needs the {BACKEND} backend, not {fmt.spec.backend!r}",
            param="structured_outputs.backend",
        )
    tag: dict[str, Any] = {}
    if tool_grammar.kind == GrammarKind.STRUCTURAL_TAG:
        tag = json.loads(tool_grammar.source)
    structures = tag.get("structures", [])
    if not structures or any(s.get("style", "json") != "json" for s in structures):
        raise NotSupported(
            f"{fmt.param} cannot be combined with tools in this server's tool-call format; "
            'use tool_choice "none" or drop the format',
            param=field,
        )
    answer_schema = (
        json.loads(fmt.spec.source) if fmt.spec.kind == GrammarKind.JSON_SCHEMA else {"type": "object"}
    )
    names = [f"call_{i}" for i in range(len(structures))]
    separator = tag.get("separator", "\n")
    lines = [
        "start: answer | calls",
        f"answer: {_json(answer_schema, fmt.spec)}",
        "calls: call" if tag.get("stop_after_first") else f"calls: call ({_literal(separator)} call)*",
        "call: " + " | ".join(names),
    ]
    for name, structure in zip(names, structures, strict=True):
        parts = [
            _literal(structure["begin"]),
            _json(structure["schema"], fmt.spec, closed=True),
            _literal(structure["end"]),
        ]
        lines.append(f"{name}: " + " ".join(p for p in parts if p))
    return GrammarSpec(
        GrammarKind.GRAMMAR,
        "\n".join(lines) + "\n",
        backend=BACKEND,
        any_whitespace=fmt.spec.any_whitespace,
        additional_properties=fmt.spec.additional_properties,
    )


def _json(schema: Any, spec: GrammarSpec, closed: bool = False) -> str:
    """`%json {...}` for one embedded schema, with the spec's whitespace and closed-object options
    (`closed`: objects without `additionalProperties` are closed whatever the spec says)."""
    if isinstance(schema, dict):
        if closed or not spec.additional_properties:
            schema = close_objects(schema)
        guidance = {**schema.get("x-guidance", {}), **guidance_json_options(spec.any_whitespace)}
        schema = {**schema, "x-guidance": guidance}
    return "%json " + json.dumps(schema, ensure_ascii=False)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False) if text else ""

"""Grammar composition: tool calls and an output format -> one structural_tag GrammarSpec.

Built from typed structural tags (constrained/structural_tag.py), never from grammar source text:

- `tool_calls_grammar`, forced False (tool_choice "auto"): free text until the call format's
  trigger, then a call, then free text again; `single` (parallel_tool_calls false): nothing after
  the call.
- `tool_calls_grammar`, forced True ("required" / a named function): no free text, at least one
  call joined by the format's separator; `single` (parallel_tool_calls false, or a named
  function): exactly one.
- `answer_or_calls` ("auto" with a JSON response format): either the JSON answer or the forced
  calls, nothing else. OpenAI answers `tools` + a json_schema `response_format` this way (the
  openai-agents SDK sends both when an agent has tools and an output type).

Both backends compile every result: xgrammar as `triggered_tags` / `tags_with_separator`, the
answer as an `or` of the answer's JSON and those calls; llguidance as Lark (`start: answer | calls`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from constrained.errors import NotComposable
from constrained.source import close_objects, load_schema
from constrained.spec import GrammarKind, GrammarSpec
from constrained.structural_tag import StructuralTag, StructuralTagGrammar

ANSWER_KINDS = (GrammarKind.JSON_SCHEMA, GrammarKind.JSON_OBJECT)
"""Output formats that can stand as the answer beside tool calls: a JSON document."""


def tool_calls_grammar(
    tags: Sequence[StructuralTag], trigger: str, separator: str, *, forced: bool, single: bool
) -> StructuralTagGrammar:
    """The grammar of tool calls written as `tags` (one per callable tool).

    `trigger`: the text that starts a call in free text (every tag's `begin` starts with it);
    `separator`: the exact text between two forced calls; `forced`: calls only (else free text
    around triggered calls); `single`: one call at most (forced: exactly one).
    Nothing is checked here; compiling the spec raises InvalidGrammar for a malformed schema.
    """
    return StructuralTagGrammar(tuple(tags), (trigger,), forced=forced, stop_after_first=single,
                                separator=separator)


def answer_or_calls(
    answer: GrammarSpec, calls: StructuralTagGrammar, close_calls: bool = True
) -> GrammarSpec:
    """A structural_tag spec accepting either the JSON document of `answer` or `calls`, forced.

    `answer`: a json_schema / json_object spec; its backend, any_whitespace and
    additional_properties become the result's. `calls`: the tool calls (`tool_calls_grammar`); its
    `forced` flag is ignored (no free text beside a JSON answer), its `stop_after_first` kept.
    `close_calls`: objects in the calls' schemas without `additionalProperties` are closed
    whatever `answer` says (the server closes tool arguments). Raises NotComposable
    (part "answer") when `answer` is not a JSON format, InvalidGrammar when its source is not a
    JSON schema (load_schema); the rest is checked when the result is compiled.
    """
    if answer.kind not in ANSWER_KINDS:
        raise NotComposable(f"{answer.kind.value} cannot be the answer beside tool calls; only a JSON schema "
                            "or json_object can", part="answer", param=answer.kind.value)
    tags = calls.tags
    if close_calls:
        tags = tuple(dataclasses.replace(t, schema=_closed(t.schema)) for t in tags)
    grammar = dataclasses.replace(calls, tags=tags, forced=True, answer=load_schema(answer))
    return grammar.spec(answer.backend, answer.any_whitespace, answer.additional_properties)


def _closed(schema: dict | bool) -> dict | bool:
    return close_objects(schema) if isinstance(schema, dict) else schema

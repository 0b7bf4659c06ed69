"""Jump-forward through a forced call's envelope into its arguments, on both grammar backends.

The JSON call formats write a call's arguments in the fixed layout (no free whitespace, `, ` and
`: `), so once the model has sampled the first token of a tool's name, the grammar forces the rest
of the name, `", "arguments": `, the arguments' `{` and, when the schema fixes it (a required first
property), the first key up to its value: `{"city":`. The forced start of a call reaches the
name's opening quote on both backends (xgrammar's own jump-forward stops before ` "`, which
XGrammarMatcher completes). Fed SmolLM2 tokens, as the engine does.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest

from toolparsers import ToolSpec, get_tool_parser

WEATHER = ToolSpec("get_weather", parameters={
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"], "additionalProperties": False})
LOOKUP = ToolSpec("search", parameters={
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
    "additionalProperties": False})
PING = ToolSpec("ping")
TOOLS = [WEATHER, LOOKUP, PING]
ARGUMENTS_KEY = {"hermes": "arguments", "llama3_json": "parameters", "mistral": "arguments"}
START = {"hermes": '<tool_call>\n{"name": "', "llama3_json": '{"name": "',
         "mistral": '[TOOL_CALLS][{"name": "'}
CASES = [(name, backend) for name in sorted(START) for backend in ("xgrammar", "guidance")]


@pytest.fixture
def forced_text(grammar_backends, smollm2_tokenizer):
    """forced_text(name, backend, written): the text the grammar of format `name` (tool_choice
    required over TOOLS) forces after the model wrote `written` (SmolLM2 tokens) past the forced
    start, and that start."""
    def run(name: str, backend: str, written: str) -> tuple[str, str]:
        spec = get_tool_parser(name)(TOOLS).grammar_for(TOOLS, "required")
        grammar_backend = grammar_backends[backend]
        compiled = grammar_backend.compile(dataclasses.replace(spec, backend=backend))
        matcher = grammar_backend.new_matcher(compiled)
        start = matcher.forced_tokens()
        assert matcher.forced_tokens() == start, "forced_tokens changed the matcher's state"
        assert matcher.accept(start)
        assert matcher.accept(smollm2_tokenizer.encode(written, add_special_tokens=False))
        forced = matcher.forced_tokens()
        assert matcher.accept(forced)
        return smollm2_tokenizer.decode(start), smollm2_tokenizer.decode(forced)
    return run


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_the_name_forces_the_arguments_up_to_the_first_key(forced_text, name: str, backend: str) -> None:
    start, after_name = forced_text(name, backend, "get")
    assert start == START[name]
    assert after_name == f'_weather", "{ARGUMENTS_KEY[name]}": {{"city":'


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_without_a_fixed_first_key_the_model_opens_the_arguments(forced_text, name: str,
                                                                  backend: str) -> None:
    """Optional keys only: ` {` is forced text, but the model picks the token (` {"` or ` {}`);
    no parameters at all: the whole call is forced."""
    _, after_name = forced_text(name, backend, "sea")
    assert after_name == f'rch", "{ARGUMENTS_KEY[name]}":'
    _, after_name = forced_text(name, backend, "p")
    assert after_name.startswith(f'ing", "{ARGUMENTS_KEY[name]}": {{}}')


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_arguments_take_no_free_whitespace(grammar_accepts, name: str, backend: str) -> None:
    accepts = partial(grammar_accepts, backend=backend)
    spec = get_tool_parser(name)(TOOLS).grammar_for(TOOLS, "required")
    end = {"hermes": "}\n</tool_call>", "llama3_json": "}", "mistral": "}]"}[name]
    head = START[name] + f'get_weather", "{ARGUMENTS_KEY[name]}": '
    assert accepts(spec, head + '{"city": "Oslo", "unit": "c"}' + end)
    for spaced in ('{ "city": "Oslo"}', '{"city": "Oslo" }', '{"city":"Oslo"}',
                   '{\n  "city": "Oslo"\n}', ' {"city": "Oslo"}', '{"city": "Oslo",  "unit": "c"}'):
        assert not accepts(spec, head + spaced + end), spaced

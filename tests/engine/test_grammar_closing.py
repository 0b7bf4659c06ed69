"""EngineRequest.close_grammar: a random-weight model (with SmolLM2's 49k vocabulary, so its
strings ramble) sampling constrained JSON under small max_tokens. With closing on, every output
parses and validates within max_tokens; with it off, max_tokens cuts some of the same outputs."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from constrained import GrammarKind, GrammarSpec
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from toolparsers import ToolSpec, get_tool_parser

SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["title", "points", "level"],
    "properties": {
        "title": {"type": "string"},
        "points": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["k", "v"], "additionalProperties": False,
            "properties": {"k": {"type": "string"}, "v": {"type": "integer"}}}},
        "level": {"type": "string", "enum": ["easy", "medium", "hard"]},
    },
}
MAX_TOKENS = (24, 32, 40, 48, 64)


@pytest.fixture
def engine(smollm2_vocab_engine: LLMEngine) -> LLMEngine:
    return smollm2_vocab_engine


def _run(engine: LLMEngine, close: bool, backend: str) -> dict[str, tuple[str, str, int]]:
    """request id -> (text, finish_reason, output tokens) of one constrained request per MAX_TOKENS."""
    spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(SCHEMA), backend=backend)
    for i, max_tokens in enumerate(MAX_TOKENS):
        params = SamplingParams(temperature=1.0, seed=100 + i, max_tokens=max_tokens)
        engine.add_request(EngineRequest(f"r{max_tokens}", list(range(10, 30)), params, spec, close_grammar=close))
    texts = {f"r{m}": "" for m in MAX_TOKENS}
    results = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            for delta in out.deltas:
                texts[out.request_id] += delta.text
                if delta.finish_reason is not None:
                    results[out.request_id] = (texts[out.request_id], delta.finish_reason, out.num_output_tokens)
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks
    return results


def _valid(text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_closing_keeps_every_output_valid_within_max_tokens(engine, backend) -> None:
    cut = _run(engine, close=False, backend=backend)
    assert sum(not _valid(text) for text, _, _ in cut.values()) >= 3, "max_tokens should cut these outputs"

    closed = _run(engine, close=True, backend=backend)
    for max_tokens in MAX_TOKENS:
        text, finish_reason, num_tokens = closed[f"r{max_tokens}"]
        assert _valid(text), (max_tokens, text)
        assert num_tokens <= max_tokens and finish_reason in ("length", "stop")
    closed_count = sum(reason == "length" for _, reason, _ in closed.values())
    assert closed_count >= 3 and engine.stats().closed_outputs == closed_count
    # an output the budget did not reach is left exactly as sampled
    for rid, (text, reason, _) in cut.items():
        if reason == "stop":
            assert closed[rid][0] == text


LOG = ToolSpec("log_food", parameters={
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {"name": {"type": "string", "maxLength": 12},
                   **{f"opt_{i:02d}": {"type": "integer"} for i in range(16)}}})


NO_CLOSE = {109: -100.0, 17859: -100.0}   # SmolLM2's "}" and "}}"


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_closing_a_tool_call_of_many_optional_members(engine, backend) -> None:
    """A forced hermes call in the fixed layout (case 043's shape, sampled): each `, ` that opens
    one more optional member lengthens the closing by a key and a value, and each key is a forced
    run of tokens, so the budget can drop below the closing between two steps unless it goes in
    early enough; every call must still close within max_tokens."""
    parser = get_tool_parser("hermes")([LOG])
    spec = dataclasses.replace(parser.grammar_for([LOG], "required", False), backend=backend,
                               additional_properties=False)
    budgets = range(40, 72, 3)
    for i, max_tokens in enumerate(budgets):
        # the model never ends the arguments itself (`}`, `}}` banned): it writes member after member
        params = SamplingParams(temperature=1.0, seed=7 + i, max_tokens=max_tokens, logit_bias=NO_CLOSE)
        engine.add_request(EngineRequest(f"r{max_tokens}", list(range(10, 30)), params, spec, close_grammar=True))
    texts = {f"r{m}": "" for m in budgets}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            for delta in out.deltas:
                texts[out.request_id] += delta.text
                assert out.num_output_tokens <= int(out.request_id[1:])
    for rid, text in texts.items():
        [call] = parser.parse(text).tool_calls
        jsonschema.validate(json.loads(call.arguments), LOG.parameters)


WEATHER = ToolSpec("get_weather", parameters={
    "type": "object", "required": ["city"], "additionalProperties": False,
    "properties": {"city": {"type": "string", "maxLength": 8}}})


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_a_forced_call_list_ends_before_a_call_that_cannot_close(engine, backend) -> None:
    """Forced parallel hermes calls, the model never choosing EOS itself: after each whole call it
    opens another, until one would start too close to max_tokens to be closed. The output then
    ends after the last whole call (finish "stop") instead of streaming a call's header that
    max_tokens then cuts."""
    parser = get_tool_parser("hermes")([WEATHER])
    spec = dataclasses.replace(parser.grammar_for([WEATHER], "required", True), backend=backend,
                               additional_properties=False)
    budgets = range(30, 80, 4)
    for i, max_tokens in enumerate(budgets):
        params = SamplingParams(temperature=1.0, seed=3 + i, max_tokens=max_tokens, logit_bias={2: -100.0})
        engine.add_request(EngineRequest(f"r{max_tokens}", list(range(10, 30)), params, spec, close_grammar=True))
    texts, reasons = {f"r{m}": "" for m in budgets}, {}
    while engine.has_work():
        for out in engine.step():
            for delta in out.deltas:
                texts[out.request_id] += delta.text
                reasons[out.request_id] = delta.finish_reason or reasons.get(out.request_id)
    for rid, text in texts.items():
        result = parser.parse(text)
        assert result.tool_calls and not result.cut_call_ids and result.content == "", (rid, text)
        for call in result.tool_calls:
            jsonschema.validate(json.loads(call.arguments), WEATHER.parameters)
    assert "stop" in reasons.values()

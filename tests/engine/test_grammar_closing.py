"""EngineRequest.close_grammar: a random-weight model (with SmolLM2's 49k vocabulary, so its
strings ramble) sampling constrained JSON under small max_tokens. With closing on, every output
parses and validates within max_tokens; with it off, max_tokens cuts some of the same outputs."""

from __future__ import annotations

import json

import jsonschema
import pytest

from constrained import GrammarKind, GrammarSpec
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams

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

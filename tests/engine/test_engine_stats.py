"""EngineStats counters on a tiny random Llama (prompt tokens only for requests that ran, generation
tokens = output tokens) and the grammar compile histogram / cache hits of StructuredOutputManager."""

from __future__ import annotations

import json
import time

import pytest

from constrained import GrammarConfig, GrammarKind, GrammarSpec, InvalidGrammar
from engine.histogram import BucketHistogram
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from engine.structured_output import StructuredOutputManager
from tiny_engine import load_tiny, make_engine

PERSON = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture
def engine(tiny_model_dir) -> LLMEngine:
    return make_engine(load_tiny(tiny_model_dir))


def test_prompt_tokens_count_only_requests_that_ran(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, n=2)
    bad_grammar = GrammarSpec(GrammarKind.JSON_SCHEMA, "{not json")
    engine.add_request(EngineRequest("bad", list(range(1, 40)), params, grammar_spec=bad_grammar))
    engine.add_request(EngineRequest("good", list(range(1, 21)), params))
    assert engine.stats().prompt_tokens == 0                     # nothing has been prefilled yet
    errors, num_output = {}, 0
    while engine.has_work():
        for out in engine.step():
            errors[out.request_id] = out.error
            num_output += sum(len(d.token_ids) for d in out.deltas)
    assert isinstance(errors["bad"], InvalidGrammar) and errors["good"] is None
    stats = engine.stats()
    assert stats.prompt_tokens == 20                             # once per request, not per choice
    assert stats.generation_tokens == num_output == 2 * 5
    assert stats.forced_tokens == 0 and stats.lora_adapters_resident == 0
    assert stats.grammar_compile_seconds.count == 1              # the failed compile (a cache miss)


def test_compile_histogram_counts_misses_and_the_cache_counts_hits(smollm2_tokenizer) -> None:
    manager = StructuredOutputManager(smollm2_tokenizer, len(smollm2_tokenizer), (2,), 4,
                                      GrammarConfig(default_backend="guidance"))
    try:
        spec = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(PERSON))
        manager.submit(spec).result(timeout=60)
        deadline = time.monotonic() + 5
        while manager.compile_seconds.snapshot().count == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the observing callback may run just after result() returns
        first = manager.compile_seconds.snapshot()
        assert first.count == 1 and 0 < first.sum < 60
        assert manager.compiler.stats().cache_hits == 0
        manager.submit(spec).result(timeout=60)
        assert manager.compiler.stats().cache_hits == 1
        time.sleep(0.05)
        assert manager.compile_seconds.snapshot().count == 1    # a hit is not a compile
    finally:
        manager.close()


def test_bucket_histogram_places_values_at_their_upper_bound() -> None:
    histogram = BucketHistogram((0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(seconds)
    snap = histogram.snapshot()
    assert snap.bucket_counts == (2, 1, 1) and snap.count == 4 and snap.sum == pytest.approx(3.65)
    with pytest.raises(ValueError):
        BucketHistogram((1.0, 0.5))

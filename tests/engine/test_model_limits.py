"""engine/model_limits.py: every token id and the context budget checked against the model, once.

The pure checks first (the same `ModelLimits` the api tests' FakeEngine runs), then the real tiny
engine: LLMEngine.validate is what AsyncEngine.generate raises at once, queueing nothing, and a
request without max_tokens runs to the end of the context.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.async_engine import AsyncEngine
from engine.errors import ContextLengthExceeded, InvalidSamplingParams
from engine.model_limits import ModelLimits
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from tiny_engine import MAX_MODEL_LEN, load_tiny, make_engine

LIMITS = ModelLimits(vocab_size=100, max_model_len=50)


def request(prompt: list[int], prompt_param: str = "prompt", **params) -> EngineRequest:
    return EngineRequest("r", prompt, SamplingParams(**params), prompt_param=prompt_param)


@pytest.mark.parametrize(
    ("prompt", "params", "param", "message"),
    [
        ([], {}, "messages", "prompt must not be empty"),
        ([1, 100], {}, "messages", "token id 100 is outside the vocabulary [0, 100)"),
        ([-1], {}, "messages", "token id -1 is outside the vocabulary"),
        ([1], {"logit_bias": {5: 1.0, 100: -1.0}}, "logit_bias", "token id 100 is outside"),
        ([1], {"stop_token_ids": (99, 10**30)}, "stop_token_ids", f"token id {10**30} is outside"),
        ([1] * 40, {"max_tokens": None, "min_tokens": 11}, "min_tokens", "min_tokens must be in [0, max_tokens]"),
    ],
)
def test_ids_outside_the_vocabulary_and_bad_budgets_are_refused(prompt, params, param, message) -> None:
    with pytest.raises(InvalidSamplingParams) as info:
        LIMITS.validate(request(prompt, "messages", **params))
    assert message in info.value.message and info.value.param == param


def test_the_context_check_names_the_limit_the_prompt_and_max_tokens() -> None:
    with pytest.raises(ContextLengthExceeded) as info:
        LIMITS.validate(request([1] * 40, "prompt[1]", max_tokens=11))
    assert info.value.param == "prompt[1]"
    assert all(str(n) in info.value.message for n in (50, 51, 40, 11)), info.value.message
    with pytest.raises(ContextLengthExceeded, match="50 tokens, but the prompt has 50 tokens") as info:
        LIMITS.validate(request([1] * 50, "input", max_tokens=None))
    assert info.value.param == "input"


def test_what_fits_passes_and_an_open_budget_is_the_rest_of_the_context() -> None:
    for fits in (request([99] * 40, max_tokens=10, logit_bias={0: 1.0, 99: -1.0}, stop_token_ids=(0, 99)),
                 request([1] * 49, max_tokens=None), request([1] * 40, max_tokens=None, min_tokens=10)):
        LIMITS.validate(fits)
    assert LIMITS.max_tokens(request([1] * 49, max_tokens=None)) == 1
    assert LIMITS.max_tokens(request([1] * 10, max_tokens=7)) == 7
    with pytest.raises(InvalidSamplingParams, match="min_tokens"):   # still a range when max_tokens is set
        SamplingParams(max_tokens=3, min_tokens=4)


def test_the_engine_refuses_at_once_and_runs_an_open_budget_to_the_context(tiny_model_dir) -> None:
    """AsyncEngine.generate raises LLMEngine.validate's error when called, before anything is
    queued (the requests of a batch are all checked before any runs); max_tokens None generates
    until the sequence fills max_model_len, finish_reason "length"."""
    engine = make_engine(load_tiny(tiny_model_dir))
    vocab_size = engine.arch.vocab_size
    bad = EngineRequest("bad", [1, 2], SamplingParams(stop_token_ids=(vocab_size,)))
    with pytest.raises(InvalidSamplingParams, match=f"token id {vocab_size} is outside") as info:
        engine.validate(bad)
    assert info.value.param == "stop_token_ids"
    long = EngineRequest("long", [1] * MAX_MODEL_LEN, SamplingParams(max_tokens=None), prompt_param="messages")
    with pytest.raises(ContextLengthExceeded, match="leaves no room"):
        engine.validate(long)
    open_budget = EngineRequest("open", [1] * (MAX_MODEL_LEN - 5), SamplingParams(temperature=0.0, max_tokens=None,
                                                                                 ignore_eos=True))
    async_engine = AsyncEngine(engine, "tiny", "tiny")
    try:
        for refused in (bad, long):
            with pytest.raises((InvalidSamplingParams, ContextLengthExceeded)):
                async_engine.generate(refused)
        assert async_engine.num_waiting() == 0

        async def run() -> list:
            return [out async for out in async_engine.generate(open_budget)]

        outputs = asyncio.run(run())
    finally:
        async_engine.shutdown()
    assert outputs[-1].num_output_tokens == 5
    assert outputs[-1].deltas[-1].finish_reason == "length"

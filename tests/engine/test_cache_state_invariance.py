"""A prompt's output does not depend on how its tokens were split into queries: cold, after a
prefix-cache hit, or in chunks sized by the step's token budget (engine/block_pool.py
`find_cached_prefix`, engine/scheduler.py `SchedulerConfig.chunk`).

On CPU a query of one token runs the decode attention kernel and a longer one the prefill kernel,
whose sums round differently. The prompt's last token used to be a one-token query after a hit on
every full block before it, or after a chunk that stopped one token short, so the first logits
(and at temperature 0 sometimes the answer) depended on what the cache held and on the other
requests in the step. The model here is the tiny random Llama on int4 weights (w4a8 at every row
count), whose projections give a row the same bits in any batch, so that any difference would
come from the split alone: the logprobs must be equal bit for bit.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.config import ALL_ROWS
from engine.model_loader import load_model_weights
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from tests.engine.tiny_engine import EOS, MAX_MODEL_LEN, make_engine

PROMPT = [(7 * i) % 250 + 1 for i in range(33)]      # 2 full blocks of 16 and one token


@pytest.fixture(scope="module")
def tiny_int4(tmp_path_factory):
    """(model, arch) of the tiny random Llama with int4 layers and an int8 head at every row count."""
    from tests.conftest import save_tiny_model

    folder = tmp_path_factory.mktemp("tiny_int4") / "LlamaForCausalLM"
    save_tiny_model(folder, "LlamaForCausalLM")
    model, arch, _ = load_model_weights(str(folder), torch.float32, torch.device("cpu"), MAX_MODEL_LEN,
                                        "int4", ALL_ROWS)
    return model, dataclasses.replace(arch, eos_token_ids=(EOS,))


def greedy_logprobs(engine, request_id: str, prompt: list[int]) -> list:
    """Run one greedy request to its end on `engine`: its tokens' logprobs with the top 5 each,
    as (token, logprob, top) tuples."""
    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=5, ignore_eos=True)
    engine.add_request(EngineRequest(request_id, list(prompt), params))
    entries = []
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            for delta in out.deltas:
                entries.extend((e.token_id, e.logprob, tuple(e.top)) for e in delta.logprobs or [])
    return entries


def test_a_prefix_hit_gives_the_cold_prompt_bit_for_bit(tiny_int4, one_torch_thread):
    """The same prompt twice: the second takes its first block from the cache (both full blocks
    would leave one token) and computes the other 17, its last in the prefill kernel as cold."""
    engine = make_engine(tiny_int4)
    cold = greedy_logprobs(engine, "cold", PROMPT)
    hit = greedy_logprobs(engine, "hit", PROMPT)
    assert engine.block_pool.stats.hits > 0, "the second request found no cached block"
    assert engine.block_pool.stats.hits == 16
    assert hit == cold


@pytest.mark.parametrize("budget", [32, 17, 31])
def test_a_chunked_prompt_gives_the_whole_prompt_bit_for_bit(tiny_int4, one_torch_thread, budget):
    """A step budget that would leave one prompt token for the next step (32 of 33) runs one token
    fewer now; budgets leaving more give the same answer too."""
    whole = greedy_logprobs(make_engine(tiny_int4, enable_prefix_caching=False), "whole", PROMPT)
    chunked_engine = make_engine(tiny_int4, enable_prefix_caching=False, max_num_batched_tokens=budget)
    assert greedy_logprobs(chunked_engine, "chunked", PROMPT) == whole

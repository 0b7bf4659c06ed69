"""LLMEngine on a tiny random Llama: preemption, chunked prefill, prefix hits and n>1 keep greedy
outputs identical; a failing step fails only its requests. Each test runs eager and on the
compiled decode step."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from engine.async_engine import AsyncEngine
from engine.errors import EngineStepError
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from tiny_engine import load_tiny, make_engine, run_all



@pytest.fixture(params=["eager", "compiled"])
def tiny(request, tiny_model_dir):
    """The tiny model, eager or with the session's compiled decode step (engine/compiled_decode.py)."""
    if request.param == "compiled":
        return request.getfixturevalue("compiled_tiny")
    return load_tiny(tiny_model_dir)


def greedy_requests(n_requests: int = 4, prompt_len: int = 20, max_tokens: int = 40) -> list[EngineRequest]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [EngineRequest(f"r{i}", [(7 * i + j) % 250 for j in range(prompt_len)], params)
            for i in range(n_requests)]


def test_preempted_requests_resume_with_the_same_greedy_output(tiny):
    roomy = run_all(make_engine(tiny), greedy_requests())
    tight_engine = make_engine(tiny, num_blocks=9)
    tight = run_all(tight_engine, greedy_requests())
    assert tight_engine.scheduler.num_preemptions > 0
    assert tight == roomy


def test_chunked_prefill_and_prefix_hits_keep_outputs(tiny):
    reference = run_all(make_engine(tiny), greedy_requests(prompt_len=50))
    chunked = make_engine(tiny, max_num_batched_tokens=16)
    assert run_all(chunked, greedy_requests(prompt_len=50)) == reference
    again = run_all(chunked, greedy_requests(prompt_len=50))        # prompts now in the prefix cache
    assert again == reference
    assert chunked.block_pool.stats.hits > 0


def test_n_choices_share_prompt_blocks_and_seeds_reproduce(tiny):
    engine = make_engine(tiny)
    params = SamplingParams(temperature=1.0, n=3, seed=11, max_tokens=10, ignore_eos=True)
    first = run_all(engine, [EngineRequest("a", list(range(40)), params)])["a"]
    assert engine.block_pool.stats.hits >= 2 * 32, "choices 1 and 2 reuse choice 0's two full blocks"
    second = run_all(make_engine(tiny), [EngineRequest("a", list(range(40)), params)])["a"]
    assert first == second and len({tuple(t) for t in first}) > 1


def test_abort_frees_blocks(tiny):
    engine = make_engine(tiny)
    for r in greedy_requests():
        engine.add_request(r)
    engine.step()
    engine.step()
    for i in range(4):
        out = engine.abort_request(f"r{i}")
        assert out is not None and out.finished and out.deltas[0].finish_reason == "abort"
    assert not engine.has_work()
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks


def test_failing_step_fails_only_its_requests(tiny):
    engine = make_engine(tiny)
    real_execute = engine.runner.execute
    calls = {"n": 0}

    def flaky(sched):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected")
        return real_execute(sched)

    engine.runner.execute = flaky
    async_engine = AsyncEngine(engine, "tiny", "tiny")

    async def consume(request):
        return [out async for out in async_engine.generate(request)]

    async def main():
        with pytest.raises(EngineStepError):
            await consume(greedy_requests(1)[0])
        outputs = await consume(dataclasses.replace(greedy_requests(1)[0], request_id="after"))
        assert outputs[-1].finished and sum(len(d.token_ids) for o in outputs for d in o.deltas) == 40

    try:
        asyncio.run(main())
        assert async_engine.is_healthy()
    finally:
        async_engine.shutdown()


class RejectingMatcher:
    """A matcher whose grammar refuses every token (as if the bitmask had let a bad token through)."""

    def accept(self, token_ids):
        return False

    def is_dead_end(self):
        return False     # its bitmask would allow tokens: the bitmask and the matcher disagree


def test_grammar_rejected_token_fails_the_request_not_stop(tiny):
    engine = make_engine(tiny)
    params = SamplingParams(temperature=0.0, n=2, max_tokens=20, ignore_eos=True)
    engine.add_request(EngineRequest("bad", list(range(20)), params))
    engine.add_request(EngineRequest("ok", list(range(30, 50)), params))
    engine.step()
    engine.structured.start_fill = lambda seqs: None   # no bitmask: the sampled token reaches accept()
    engine.requests["bad"].seqs[0].matcher = RejectingMatcher()
    outputs = {out.request_id: out for out in engine.step()}
    bad = outputs["bad"]
    assert bad.finished and isinstance(bad.error, EngineStepError) and "grammar rejected" in str(bad.error)
    assert sorted(d.finish_reason for d in bad.deltas) == ["abort", "error"]
    assert outputs["ok"].error is None and not outputs["ok"].finished
    while engine.has_work():
        assert all(out.error is None for out in engine.step())
    engine.scheduler.check_invariants()
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks


def test_largest_seed_with_several_choices_runs(tiny):
    """Choice i seeds with seed + i mod 2**64: the top seed with n = 2 must not overflow manual_seed."""
    params = SamplingParams(temperature=1.0, n=2, seed=2**64 - 1, max_tokens=3, ignore_eos=True)
    choices = run_all(make_engine(tiny), [EngineRequest("a", list(range(8)), params)])["a"]
    assert [len(tokens) for tokens in choices] == [3, 3]
    wrapped = SamplingParams(temperature=1.0, seed=0, max_tokens=3, ignore_eos=True)
    assert run_all(make_engine(tiny), [EngineRequest("a", list(range(8)), wrapped)])["a"][0] == choices[1]


@pytest.mark.parametrize("include_stop", [False, True])
def test_stop_string_completed_by_the_final_flush_ends_with_stop(tiny_model_dir, include_stop):
    """max_tokens ends an output inside a multi-byte character, whose flush adds U+FFFD: a stop
    string that this completes matches like any other (the text is cut there, finish_reason "stop",
    stop_reason the string, no logprob entry for the cut token), never "length" with cut text."""
    engine = make_engine(load_tiny(tiny_model_dir))
    lead_byte = 0xE6   # starts a 3-byte character that never finishes: every token is this byte
    fields = dict(temperature=0.0, max_tokens=2, ignore_eos=True, logprobs=0, logit_bias={lead_byte: 100.0})
    cut = SamplingParams(stop=["\ufffd"], include_stop_str_in_output=include_stop, **fields)
    requests = [EngineRequest("cut", [1, 2, 3], cut),
                EngineRequest("plain", [1, 2, 3], SamplingParams(stop=["never"], **fields))]
    for r in requests:
        engine.add_request(r)
    ends = {}
    while engine.has_work():
        for out in engine.step():
            for d in out.deltas:
                text, entries, _, _ = ends.get(out.request_id, ("", [], None, None))
                entries = entries + (d.logprobs or [])
                ends[out.request_id] = (text + d.text, entries, d.finish_reason, d.stop_reason)
    assert ends["plain"][::2] == ("\ufffd\ufffd", "length")
    text, entries, finish_reason, stop_reason = ends["cut"]
    assert (text, finish_reason, stop_reason) == ("\ufffd" if include_stop else "", "stop", "\ufffd")
    assert b"".join(e.text_bytes for e in entries) == text.encode()
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks

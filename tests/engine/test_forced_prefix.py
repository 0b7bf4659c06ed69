"""Jump-forward before the first forward (`LLMEngine._poll_grammars`): a grammar that forces tokens
from the start (a forced hermes call: `<tool_call>\\n{"name": "`) has them appended before the
prefill, so the prefill computes them and its sample is the first free token. A random-weight Llama
with SmolLM2's vocabulary writes the call; its token ids equal a token-by-token reference (the
transformers model run over the whole sequence at every token, greedy under the grammar's bitmask,
appending the grammar's forced tokens wherever it forces some, the start included), for n = 2,
under preemption, and cut by a max_tokens shorter than the forced prefix."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_engine import make_smollm2_vocab_engine, run_all

from constrained import allocate_bitmask
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from toolparsers import ToolSpec, get_tool_parser

TOOLS = [
    ToolSpec(name="get_weather", parameters={
        "type": "object", "required": ["city"], "additionalProperties": False,
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}),
    ToolSpec(name="search_web", parameters={
        "type": "object", "required": ["query"], "additionalProperties": False,
        "properties": {"query": {"type": "string"}}}),
]
FORCED_START = '<tool_call>\n{"name": "'
EOS = 2


def call_spec(backend: str):
    """The forced ("required") hermes call of TOOLS on `backend`."""
    grammar = get_tool_parser("hermes")(TOOLS).grammar_for(TOOLS, "required")
    assert grammar is not None
    return dataclasses.replace(grammar, backend=backend)


def prompt(i: int) -> list[int]:
    return [(11 * i + j) % 4000 + 100 for j in range(20)]


@torch.no_grad()
def reference_tokens(hf_model, matcher, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy output token ids computed one token at a time, without a KV cache: the grammar's
    forced tokens are appended wherever it forces some, every other token is the argmax of the
    masked logits of the whole sequence; ends at EOS (not returned) or max_tokens."""
    tokens, out = list(prompt_ids), []
    bitmask = allocate_bitmask(1, hf_model.config.vocab_size)
    while len(out) < max_tokens:
        forced = matcher.forced_tokens()[:max_tokens - len(out)]
        assert matcher.accept(forced) if forced else True
        tokens += forced
        out += forced
        if len(out) == max_tokens:
            break
        logits = hf_model(torch.tensor([tokens])).logits[0, -1]
        matcher.fill_bitmask(bitmask, 0)
        bits = (bitmask[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = bits.flatten()[:logits.shape[0]].bool()
        token = int(torch.where(allowed, logits, -torch.inf).argmax())
        if token == EOS:
            break
        assert matcher.accept([token])
        tokens.append(token)
        out.append(token)
    return out


@pytest.fixture
def tiny_vocab(tiny_model_dir, one_torch_thread):
    """(folder, transformers model) of the tiny random Llama with SmolLM2's vocabulary."""
    return tiny_model_dir("LlamaForCausalLM", vocab_size=49152)


@pytest.fixture
def compiler(smollm2_vocab_engine: LLMEngine):
    """The engine's grammar compiler, for fresh matchers of the reference."""
    return smollm2_vocab_engine.structured.compiler


def run(engine: LLMEngine, requests: list[EngineRequest]) -> tuple[dict[str, list[list[int]]], list[list[int]]]:
    """(request id -> token ids per choice, tokens scheduled per sequence at each forward)."""
    scheduled: list[list[int]] = []
    execute = engine.runner.execute

    def recording(sched):
        scheduled.append([item.num_scheduled_tokens for item in sched.scheduled])
        return execute(sched)

    engine.runner.execute = recording
    try:
        tokens = run_all(engine, requests)
    finally:
        engine.runner.execute = execute
    return tokens, scheduled


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_forced_prefix_runs_in_the_first_forward(smollm2_vocab_engine, tiny_vocab, compiler, smollm2_tokenizer,
                                                 backend) -> None:
    engine, spec = smollm2_vocab_engine, call_spec(backend)
    forced = compiler.new_matcher(compiler.compile(spec)).forced_tokens()
    # llguidance forces all of FORCED_START, xgrammar stops before the space (` "` may be one token)
    assert FORCED_START.startswith(smollm2_tokenizer.decode(forced)) and len(forced) >= 8
    params = SamplingParams(temperature=0, n=2, max_tokens=24)
    engine.add_request(EngineRequest("r", prompt(0), params, spec))
    first = engine.step()
    assert len(first) == 1, "the forced prefix goes out with the prefill's first sample, in one output"
    # choice 0 samples after its prefill (and jumps forward again past the name); choice 1 waits
    # for choice 0's prompt block (then hits it), its forced prefix already out
    assert [d.index for d in first[0].deltas] == [0, 1]
    assert len(first[0].deltas[0].token_ids) > len(forced) and first[0].deltas[1].token_ids == forced
    assert all(d.text.startswith('<tool_call>\n{"name":') for d in first[0].deltas)
    while engine.has_work():
        engine.step()

    tokens, scheduled = run(engine, [EngineRequest("again", prompt(1), params, spec)])
    assert scheduled[0] == [len(prompt(1)) + len(forced)]
    assert engine.stats().prompt_tokens == 2 * len(prompt(0))
    reference = reference_tokens(tiny_vocab[1], compiler.new_matcher(compiler.compile(spec)), prompt(1), 24)
    assert tokens["again"] == [reference, reference]
    assert smollm2_tokenizer.decode(reference).startswith(FORCED_START)


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_max_tokens_inside_the_forced_prefix_ends_before_any_forward(smollm2_vocab_engine, compiler,
                                                                     max_tokens) -> None:
    engine, spec = smollm2_vocab_engine, call_spec("guidance")
    forced = compiler.new_matcher(compiler.compile(spec)).forced_tokens()
    assert len(forced) > max_tokens
    engine.add_request(EngineRequest("r", prompt(0), SamplingParams(temperature=0, max_tokens=max_tokens), spec))
    outputs = engine.step()
    assert not engine.has_work() and not engine.last_step_scheduled
    (out,) = outputs
    assert out.finished and out.num_output_tokens == max_tokens
    assert out.deltas[0].token_ids == forced[:max_tokens] and out.deltas[0].finish_reason == "length"
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks
    assert engine.stats().forced_tokens == max_tokens and engine.stats().prompt_tokens == 0


def test_logprobs_keep_token_by_token_sampling(smollm2_vocab_engine) -> None:
    """With logprobs nothing is jump-forwarded: every output token has a sampled logprob."""
    engine = smollm2_vocab_engine
    params = SamplingParams(temperature=0, max_tokens=3, logprobs=0)
    engine.add_request(EngineRequest("r", prompt(0), params, call_spec("guidance")))
    per_step: list[int] = []
    while engine.has_work():
        per_step += [len(d.token_ids) for out in engine.step() for d in out.deltas]
    assert per_step == [1, 1, 1] and engine.stats().forced_tokens == 0


def test_preempted_sequences_keep_their_forced_prefix(tiny_vocab, smollm2_tokenizer) -> None:
    spec = call_spec("guidance")
    params = SamplingParams(temperature=0, max_tokens=24)
    requests = [EngineRequest(f"r{i}", prompt(i), params, spec) for i in range(4)]
    roomy_engine = make_smollm2_vocab_engine(tiny_vocab[0], smollm2_tokenizer)
    tight_engine = make_smollm2_vocab_engine(tiny_vocab[0], smollm2_tokenizer, max_model_len=128, num_blocks=8)
    try:
        roomy, _ = run(roomy_engine, requests)
        tight, _ = run(tight_engine, requests)
    finally:
        roomy_engine.structured.close()
        tight_engine.structured.close()
    assert tight_engine.scheduler.num_preemptions > 0
    assert tight == roomy
    assert all(smollm2_tokenizer.decode(t[0]).startswith(FORCED_START) for t in tight.values())

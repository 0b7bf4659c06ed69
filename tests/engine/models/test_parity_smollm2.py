"""The default model (SmolLM2-135M-Instruct, GGUF Q4_1) loaded by us against transformers' own GGUF
loader, both float32: same logits within atol 1e-3 (observed: bit-identical) and the same 32
greedy tokens for two chat prompts decoded together in one paged batch. The compiled decode step
(engine/compiled_decode.py) against our eager float32 forward: logits within atol 1e-3 and the same
greedy tokens, for batches of 2 and of 1 (a graph of its own)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import torch
from paged_batch import PagedBatch

from engine.compiled_decode import CompiledDecode
from engine.model_loader import LoadedModel, default_model_path
from tests.conftest import smollm2_gguf

pytestmark = pytest.mark.slow
NUM_NEW_TOKENS = 32
ATOL = 1e-3
QUESTIONS = ["What is the capital of France?", "Write a haiku about paged attention."]


@pytest.fixture(scope="module")
def loaded(smollm2_float32) -> LoadedModel:
    """Our float32 load of the default model (session fixture, conftest.py)."""
    return smollm2_float32


def hf_greedy(hf_model, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens and the logits `[NUM_NEW_TOKENS, vocab]` each was taken from."""
    cache_arg = "cache" if "cache" in inspect.signature(hf_model.forward).parameters else "past_key_values"
    tokens, rows = [], []
    with torch.no_grad():
        out = hf_model(torch.tensor([prompt]), use_cache=True)
        for _ in range(NUM_NEW_TOKENS):
            logits = out.logits[0, -1]
            rows.append(logits)
            tokens.append(int(logits.argmax()))
            kv = {cache_arg: getattr(out, cache_arg)}  # transformers renamed past_key_values to cache
            out = hf_model(torch.tensor([[tokens[-1]]]), use_cache=True, **kv)
    return tokens, torch.stack(rows)


def test_loaded_model_describes_smollm2(loaded: LoadedModel) -> None:
    arch = loaded.arch
    assert loaded.name == "SmolLM2-135M-Instruct.Q4_1" and loaded.path.endswith(".gguf")
    assert (arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads) == (30, 576, 9, 3)
    assert (arch.vocab_size, arch.rope_theta, arch.tie_word_embeddings) == (49152, 100000.0, True)
    assert loaded.max_model_len == 1024 and 134e6 < loaded.num_params < 135e6
    assert "<|im_start|>" in loaded.tokenizer.chat_template
    assert loaded.tokenizer.convert_ids_to_tokens(list(arch.eos_token_ids)) == ["<|im_end|>"]


def chat_prompts(loaded: LoadedModel) -> list[list[int]]:
    """Token ids of QUESTIONS as single-turn chat prompts."""
    prompts = [
        loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )
        for q in QUESTIONS
    ]
    return [list(p["input_ids"]) if not isinstance(p, list) else p for p in prompts]


def test_greedy_decode_matches_transformers(loaded: LoadedModel, smollm2_hf_model) -> None:
    assert Path(default_model_path()).resolve() == smollm2_gguf().resolve()
    hf_model = smollm2_hf_model     # transformers' own load of that GGUF file
    prompts = chat_prompts(loaded)
    model, batch = loaded.model, PagedBatch(loaded.arch, num_blocks=32, block_size=16)
    chunks = [(i, prompt) for i, prompt in enumerate(prompts)]
    ours: list[list[int]] = [[], []]
    our_logits: list[list[torch.Tensor]] = [[], []]
    for _ in range(NUM_NEW_TOKENS):
        input_ids, positions, meta = batch.step(chunks)
        last_rows = (meta.cu_seqlens_q[1:] - 1).long()
        hidden = model(input_ids, positions, batch.kv_caches, meta)
        logits = model.compute_logits(hidden.index_select(0, last_rows))
        for i in range(2):
            our_logits[i].append(logits[i])
            ours[i].append(int(logits[i].argmax()))
        chunks = [(i, [ours[i][-1]]) for i in range(2)]

    for i, prompt in enumerate(prompts):
        tokens, expected = hf_greedy(hf_model, prompt)
        assert ours[i] == tokens, loaded.tokenizer.decode(ours[i])
        torch.testing.assert_close(torch.stack(our_logits[i]), expected, atol=ATOL, rtol=0)


@pytest.mark.timeout(1800)     # a cold compile of 30 layers: ~1-2 min of CPU, many more on a busy box
@torch.inference_mode()
def test_compiled_decode_matches_eager(loaded: LoadedModel) -> None:
    """Both paths decode the eager path's greedy tokens (teacher-forced) from the same prefill, in
    two caches with the same block layout: 10 steps of both prompts, then 8 of the first alone."""
    model, scratch = loaded.model, 32
    eager_batch, compiled_batch = (PagedBatch(loaded.arch, num_blocks=scratch + 1, block_size=16) for _ in range(2))
    for batch in (eager_batch, compiled_batch):
        batch.free_blocks.remove(scratch)           # the scratch block: never handed to a sequence
    compiled = CompiledDecode(model)
    compiled.warm_up(compiled_batch.kv_caches, scratch)
    chunks = list(enumerate(chat_prompts(loaded)))
    for batch in (eager_batch, compiled_batch):
        input_ids, positions, meta = batch.step(chunks)
        hidden = model(input_ids, positions, batch.kv_caches, meta)
    tokens = model.compute_logits(hidden.index_select(0, (meta.cu_seqlens_q[1:] - 1).long())).argmax(-1).tolist()
    for step in range(18):
        live = [0, 1] if step < 10 else [0]
        chunks = [(i, [tokens[i]]) for i in live]
        input_ids, positions, meta = eager_batch.step(chunks)
        eager = model.compute_logits(model(input_ids, positions, eager_batch.kv_caches, meta))
        input_ids, positions, meta = compiled_batch.step(chunks)
        got = compiled.run(input_ids, positions, compiled_batch.kv_caches,
                           dataclasses.replace(meta, decode_only=True))
        torch.testing.assert_close(got, eager, atol=ATOL, rtol=0)
        assert got.argmax(-1).tolist() == eager.argmax(-1).tolist()
        for i, token in zip(live, eager.argmax(-1).tolist()):
            tokens[i] = token

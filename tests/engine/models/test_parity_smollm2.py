"""The default model (SmolLM2-135M-Instruct, GGUF Q4_1) loaded by us against transformers' own GGUF
loader, both float32: same logits within atol 1e-3 (observed: bit-identical) and the same 32
greedy tokens for two chat prompts decoded together in one paged batch."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from paged_batch import PagedBatch

from engine.model_loader import LoadedModel, default_model_path, load_model
from tests.conftest import smollm2_gguf

pytestmark = pytest.mark.slow
NUM_NEW_TOKENS = 32
ATOL = 1e-3
QUESTIONS = ["What is the capital of France?", "Write a haiku about paged attention."]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None, torch.float32, torch.device("cpu"), 1024)


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


def test_greedy_decode_matches_transformers(loaded: LoadedModel, smollm2_hf_model) -> None:
    assert Path(default_model_path()).resolve() == smollm2_gguf().resolve()
    hf_model = smollm2_hf_model     # transformers' own load of that GGUF file
    prompts = [
        loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )
        for q in QUESTIONS
    ]
    prompts = [list(p["input_ids"]) if not isinstance(p, list) else p for p in prompts]
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

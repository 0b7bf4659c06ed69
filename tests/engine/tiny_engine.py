"""A tiny random-weight Llama behind an LLMEngine, with the byte tokenizer of tests/byte_tokenizer.py
(EOS = 255): the shared setup of the engine tests that need real steps but not a real vocabulary."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.model_loader import load_model_weights
from engine.model_runner import kv_block_bytes
from tests.byte_tokenizer import ByteTokenizer

EOS = 255
MAX_MODEL_LEN = 128


def load_tiny(tiny_model_dir) -> tuple[Any, Any]:
    """(model, arch) of the tiny random Llama from the `tiny_model_dir` fixture, EOS = 255."""
    folder, _ = tiny_model_dir("LlamaForCausalLM")
    return load_tiny_folder(folder)


def load_tiny_folder(folder: Path) -> tuple[Any, Any]:
    """(model, arch) of a tiny random model saved in `folder` (tests/conftest.py), EOS = 255."""
    model, arch, _ = load_model_weights(str(folder), torch.float32, torch.device("cpu"), MAX_MODEL_LEN)
    return model, dataclasses.replace(arch, eos_token_ids=(EOS,))


def make_engine(tiny: tuple[Any, ...], num_blocks: int = 64, tokenizer: Any = None, **overrides: Any) -> LLMEngine:
    """An LLMEngine over `tiny` = (model, arch) or (model, arch, its CompiledDecode, ready) with
    `num_blocks` KV blocks of 16 tokens; `tokenizer` defaults to the byte tokenizer (EOS 255);
    `overrides` go to EngineConfig."""
    model, arch = tiny[:2]
    compiled = tiny[2] if len(tiny) > 2 else None
    per_block = kv_block_bytes(arch.num_layers, 16, arch.num_kv_heads, arch.head_dim, torch.float32)
    config = EngineConfig(kv_cache_memory_bytes=num_blocks * per_block, **overrides)
    tokenizer = tokenizer if tokenizer is not None else ByteTokenizer(eos_token_id=EOS)
    return LLMEngine(config, model, arch, tokenizer, torch.device("cpu"), torch.float32,
                     MAX_MODEL_LEN, compiled_decode=compiled)


def make_smollm2_vocab_engine(folder: Path, tokenizer: Any, max_model_len: int = 256, num_blocks: int = 96) -> LLMEngine:
    """An LLMEngine over the tiny random Llama saved in `folder` with SmolLM2's 49k vocabulary
    (`save_tiny_model(folder, "LlamaForCausalLM", vocab_size=49152)`; its strings ramble) and
    SmolLM2's `tokenizer` (EOS 2), with `num_blocks` KV blocks of 16 tokens. Close
    `engine.structured` when done (its grammar threads)."""
    model, arch, _ = load_model_weights(str(folder), torch.float32, torch.device("cpu"), max_model_len)
    arch = dataclasses.replace(arch, eos_token_ids=(2,))
    per_block = kv_block_bytes(arch.num_layers, 16, arch.num_kv_heads, arch.head_dim, torch.float32)
    config = EngineConfig(kv_cache_memory_bytes=num_blocks * per_block)
    return LLMEngine(config, model, arch, tokenizer, torch.device("cpu"), torch.float32, max_model_len)


def run_all(engine: LLMEngine, requests: list[EngineRequest]) -> dict[str, list[list[int]]]:
    """Add `requests` and step `engine` until it is idle: request id -> token ids per choice.
    Every output must be error-free, the scheduler's invariants hold after each step, and every
    KV block is free at the end."""
    for r in requests:
        engine.add_request(r)
    tokens = {r.request_id: [[] for _ in range(r.sampling_params.n)] for r in requests}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            for d in out.deltas:
                tokens[out.request_id][d.index].extend(d.token_ids)
        engine.scheduler.check_invariants()
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks
    return tokens

"""Fixtures for engine tests: the real SmolLM2 tokenizer is the session fixture `smollm2_tokenizer`
of tests/conftest.py (loaded once for the whole run); `compiled_tiny` is the tiny random Llama of
tiny_engine.py with its decode step compiled once for the whole run; `smollm2_vocab_engine` is an
LLMEngine over a tiny random Llama with SmolLM2's vocabulary and tokenizer (constrained output)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tiny_engine import load_tiny_folder, make_engine

from engine.compiled_decode import CompiledDecode
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.model_loader import load_model_weights
from engine.model_runner import kv_block_bytes
from tests.conftest import save_tiny_model


@pytest.fixture(scope="session")
def compiled_tiny(tmp_path_factory) -> tuple[Any, Any, CompiledDecode]:
    """(model, arch, CompiledDecode ready) of the tiny random Llama (the same weights as
    `load_tiny`), warmed up once per session: ~10-25 s cold on 2 cores, seconds from inductor's
    cache. Engines built with `make_engine(compiled_tiny)` share the compiled graphs."""
    folder = tmp_path_factory.mktemp("compiled_tiny") / "LlamaForCausalLM"
    save_tiny_model(folder, "LlamaForCausalLM")
    model, arch = load_tiny_folder(folder)
    compiled = CompiledDecode(model)
    runner = make_engine((model, arch)).runner
    previous = torch.get_num_threads()
    torch.set_num_threads(1)     # tiny graphs: a second contended thread only adds barrier waits
    try:
        compiled.warm_up(runner.kv_caches, runner.scratch_block)
    finally:
        torch.set_num_threads(previous)
    return model, arch, compiled


@pytest.fixture
def smollm2_vocab_engine(tiny_model_dir, smollm2_tokenizer, one_torch_thread) -> Iterator[LLMEngine]:
    """An LLMEngine over a tiny random Llama with SmolLM2's 49k vocabulary (so its strings ramble)
    and SmolLM2's tokenizer (EOS 2), 96 KV blocks, max_model_len 256; its grammar threads are
    closed after the test."""
    folder, _ = tiny_model_dir("LlamaForCausalLM", vocab_size=49152)
    model, arch, _ = load_model_weights(str(folder), torch.float32, torch.device("cpu"), 256)
    arch = dataclasses.replace(arch, eos_token_ids=(2,))
    per_block = kv_block_bytes(arch.num_layers, 16, arch.num_kv_heads, arch.head_dim, torch.float32)
    config = EngineConfig(kv_cache_memory_bytes=96 * per_block)
    llm = LLMEngine(config, model, arch, smollm2_tokenizer, torch.device("cpu"), torch.float32, 256)
    yield llm
    llm.structured.close()

"""Fixtures for engine tests: the real SmolLM2 tokenizer is the session fixture `smollm2_tokenizer`
of tests/conftest.py (loaded once for the whole run); `compiled_tiny` is the tiny random Llama of
tiny_engine.py with its decode step compiled once for the whole run; `smollm2_vocab_engine` is an
LLMEngine over a tiny random Llama with SmolLM2's vocabulary and tokenizer (constrained output)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tiny_engine import load_tiny_folder, make_engine, make_smollm2_vocab_engine

from engine.compiled_decode import CompiledDecode
from engine.llm_engine import LLMEngine
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
    """`tiny_engine.make_smollm2_vocab_engine` for one test; its grammar threads are closed after it."""
    folder, _ = tiny_model_dir("LlamaForCausalLM", vocab_size=49152)
    llm = make_smollm2_vocab_engine(folder, smollm2_tokenizer)
    yield llm
    llm.structured.close()

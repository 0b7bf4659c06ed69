"""Fixtures for engine tests: the real SmolLM2 tokenizer is the session fixture `smollm2_tokenizer`
of tests/conftest.py (loaded once for the whole run); `compiled_tiny` is the tiny random Llama of
tiny_engine.py with its decode step compiled once for the whole run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny_engine import load_tiny_folder, make_engine

from engine.compiled_decode import CompiledDecode
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

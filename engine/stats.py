"""A snapshot of the engine's counters and gauges, read by /metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Engine state at one instant. Counters are totals since start; token counts in tokens.

    kv_cache_usage: fraction of KV blocks held by sequences (0.0 to 1.0); cached-but-free
    blocks count as free. prefix_cache_*: prompt tokens looked up / served by a hit.
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

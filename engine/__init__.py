"""The engine's public surface: what `api/` (and anything else above the engine) may import.

Everything else under `engine/` is private to the engine. `AsyncEngine` is imported on first use
(PEP 562 module `__getattr__`): it pulls in torch and the model code, which a process that only
builds requests or reads errors (the CLI's argument parsing, tests with a fake engine) does not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.config import (
    ALL_ROWS, DEFAULT_INT4_KERNEL, DEFAULT_KV_CACHE_MEMORY_BYTES, DEFAULT_MAX_WAITING_REQUESTS, INT4_KERNEL_CHOICES, EngineConfig,
)
from engine.errors import (
    ContextLengthExceeded,
    EngineDeadError,
    EngineError,
    EngineOverloaded,
    EngineStepError,
    InvalidSamplingParams,
    ModelLoadError,
    RequestTimedOut,
)
from engine.histogram import HistogramSnapshot
from engine.request import CompletionDelta, EngineRequest, RequestOutput, TokenLogprob
from engine.sampling_params import MAX_LOGPROBS, MAX_N, MAX_TEMPERATURE, SEED_RANGE, SamplingParams
from engine.stats import EngineStats

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine

__all__ = [
    "ALL_ROWS",
    "DEFAULT_INT4_KERNEL",
    "DEFAULT_KV_CACHE_MEMORY_BYTES",
    "DEFAULT_MAX_WAITING_REQUESTS",
    "AsyncEngine",
    "CompletionDelta",
    "ContextLengthExceeded",
    "EngineConfig",
    "EngineDeadError",
    "EngineError",
    "EngineOverloaded",
    "EngineRequest",
    "EngineStats",
    "EngineStepError",
    "HistogramSnapshot",
    "MAX_LOGPROBS",
    "MAX_N",
    "MAX_TEMPERATURE",
    "InvalidSamplingParams",
    "ModelLoadError",
    "RequestOutput",
    "RequestTimedOut",
    "SEED_RANGE",
    "SamplingParams",
    "TokenLogprob",
]


def __getattr__(name: str) -> Any:
    """`engine.AsyncEngine`, imported on first access; AttributeError for any other unknown name."""
    if name == "AsyncEngine":
        from engine.async_engine import AsyncEngine

        return AsyncEngine
    raise AttributeError(f"module 'engine' has no attribute {name!r}")

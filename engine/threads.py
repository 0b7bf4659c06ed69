"""CPU thread settings for torch, chosen by measuring this machine at start-up."""

from __future__ import annotations

import logging
import os
import statistics
import time

import torch

from engine.models.packed_linear import linear, prepack_weight

logger = logging.getLogger(__name__)


def available_cores() -> int:
    """Cores this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


def measure_best_threads(hidden_size: int, intermediate_size: int, num_rows: int = 32,
                         candidates: list[int] | None = None, repeats: int = 8) -> int:
    """Time a decode-sized MLP matmul ([num_rows, hidden] x [hidden, 2*intermediate], float32, through
    the same path the model uses: engine/models/packed_linear.py) at each thread count and return
    the fastest (median of `repeats`; about a second in all). The counts are timed in turns, one
    call each per round, so a burst of load from another process slows every count alike instead
    of deciding the choice by landing on one of them.

    Why measure: on a 2-core box that is busy with other work, OpenMP barriers make small matmuls
    many times slower with two threads than with one, while on an idle box two threads win.
    """
    candidates = candidates or list(range(1, available_cores() + 1))
    x = torch.randn(num_rows, hidden_size)
    w = torch.randn(2 * intermediate_size, hidden_size)
    packed = prepack_weight(w)
    samples: dict[int, list[float]] = {n: [] for n in candidates}
    for round_index in range(3 + repeats):           # the first 3 rounds warm each count up
        for n in candidates:
            torch.set_num_threads(n)
            start = time.perf_counter()
            linear(x, w, None, packed)
            if round_index >= 3:
                samples[n].append(time.perf_counter() - start)
    timings = {n: statistics.median(times) for n, times in samples.items()}
    best = min(timings, key=lambda n: timings[n])
    logger.info("matmul timings by thread count (ms): %s; using %d",
                {n: round(1000 * t, 3) for n, t in timings.items()}, best)
    return best


def configure_threads(num_threads: int | None, hidden_size: int, intermediate_size: int) -> int:
    """Set torch's intra-op threads: `num_threads` when given, else the measured best; returns it."""
    n = num_threads or (measure_best_threads(hidden_size, intermediate_size) if available_cores() > 1 else 1)
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass   # already set once in this process
    logger.info("torch intra-op threads: %d", n)
    return n

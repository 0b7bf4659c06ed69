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
                         candidates: list[int] | None = None, repeats: int = 8, rounds: int = 3) -> int:
    """Time a decode-sized MLP matmul ([num_rows, hidden] x [hidden, 2*intermediate], float32, through
    the same path the model uses: engine/models/packed_linear.py) at each thread count and return
    the fastest (about a second in all). Each count is timed in `rounds` blocks (set the count, warm
    up, median of `repeats` calls), the counts taking turns; a count's time is its best block, so a
    burst of load from another process that lands on one block does not decide the choice. (Timing
    the counts call by call instead would charge every call the cost of switching the count.)

    Why measure: on a 2-core box that is busy with other work, OpenMP barriers make small matmuls
    many times slower with two threads than with one, while on an idle box two threads win.
    """
    candidates = candidates or list(range(1, available_cores() + 1))
    x = torch.randn(num_rows, hidden_size)
    w = torch.randn(2 * intermediate_size, hidden_size)
    packed = prepack_weight(w)
    blocks: dict[int, list[float]] = {n: [] for n in candidates}
    for _ in range(rounds):
        for n in candidates:
            torch.set_num_threads(n)
            for _ in range(3):
                linear(x, w, None, packed)
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                linear(x, w, None, packed)
                samples.append(time.perf_counter() - start)
            blocks[n].append(statistics.median(samples))
    timings = {n: min(times) for n, times in blocks.items()}
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

"""CPU thread settings for torch, chosen by measurement (see benchmarks/threads_bench.py)."""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)


def default_num_threads() -> int:
    """Intra-op threads when --num-threads is not given: every core this process may use."""
    return max(1, len(os.sched_getaffinity(0)))


def configure_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads (and one inter-op thread); returns the number set."""
    n = num_threads or default_num_threads()
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass   # already set once in this process
    logger.info("torch intra-op threads: %d", n)
    return n

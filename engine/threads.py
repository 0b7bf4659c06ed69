"""CPU thread settings for torch: every core the process may use unless told otherwise.

Like llama.cpp (`-t` defaults to the physical cores) and vLLM's CPU backend (all cores of the
process's affinity mask), the count is fixed by the machine, not measured: a start-up timing on a
busy machine once picked 1 thread for a server's whole life (c=32 at 359 tok/s instead of 463).
"""

from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__name__)


def available_cores() -> int:
    """Cores this process may run on (its affinity mask), at least 1."""
    return max(1, len(os.sched_getaffinity(0)))


def configure_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads to `num_threads`, or to `available_cores()` when None, and
    inter-op threads to 1 (once per process); returns the intra-op count. Raises ValueError for
    a count below 1."""
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    n = num_threads or available_cores()
    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass   # already set once in this process
    logger.info("torch intra-op threads: %d (%d usable cores)", n, available_cores())
    return n

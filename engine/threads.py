"""CPU thread settings for torch: every core the process may use unless told otherwise.

Like llama.cpp (`-t` defaults to the physical cores) and vLLM's CPU backend (all cores of the
process's affinity mask), the count is fixed by the machine, not measured: a start-up timing on a
busy machine once picked 1 thread for a server's whole life (c=32 at 359 tok/s instead of 463).
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

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


_OPENMP_LIBRARIES = ("libgomp", "libiomp5", "libomp")   # GNU (torch's CPU wheels), Intel, LLVM


def release_openmp_threads() -> bool:
    """Free the calling thread's OpenMP worker pool (`omp_pause_resource_all(omp_pause_soft)`,
    OpenMP 5.0), so that a thread that has finished its torch work stops counting against the
    thread that steps the engine. Returns False when no OpenMP runtime with that call is loaded
    (nothing to free) or the runtime refuses (inside a parallel region).

    Why: each thread that runs a parallel region keeps a pool of workers for its next one, and
    libgomp counts the workers of every pool; once they outnumber the cores, every pool's workers
    stop spinning between regions and sleep on a futex (libgomp's throttled spin count), and each
    region then pays their wake-up. Measured on the project's 2-core box: one w4a8 projection 51
    against 15 us, SmolLM2's compiled one-sequence forward 12-15 against 5.2 ms, when a thread
    other than the one that loaded the model ran it while the loader's pool was still held. The
    runtime rebuilds a pool when its thread next runs a parallel region.
    """
    library = _loaded_openmp_library()
    if library is None:
        return False
    try:
        pause = library.omp_pause_resource_all
    except AttributeError:
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause(_OMP_PAUSE_SOFT) == 0


_OMP_PAUSE_SOFT = 1   # omp_pause_resource_t: omp_pause_soft


def _loaded_openmp_library() -> ctypes.CDLL | None:
    """The OpenMP runtime already mapped into this process (torch's), from /proc/self/maps; None
    when there is none (or no /proc)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for line in maps:
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if any(Path(path).name.startswith(name) for name in _OPENMP_LIBRARIES):
            return ctypes.CDLL(path)
    return None

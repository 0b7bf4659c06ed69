"""Give the heap's free pages back to the operating system after the start-up's big transient
allocations (weight unpacking at load, the compiler's work in the decode step's warm-up).

Why: glibc's malloc keeps freed memory in its arenas, so a process that once held a few hundred MB
of temporaries keeps them resident although nothing uses them. `malloc_trim(0)` (glibc, man 3
malloc_trim) returns every free page it can; `gc.collect()` first frees what only cycles still
hold. Elsewhere (musl, macOS) there is no such call and this only collects.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


def release_free_memory() -> bool:
    """Collect garbage, then trim glibc's heap; True when glibc's malloc_trim ran (and returned
    memory, per its result). Never raises: without glibc it only collects and returns False."""
    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))

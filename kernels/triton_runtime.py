"""Triton where a kernel can run, else None: the one import of triton for every kernel here.

Triton kernels run on a GPU, or on the CPU under its interpreter (TRITON_INTERPRET=1, how the
kernel tests run them). On a machine with neither, triton is never imported: `sys.modules["triton"]`
is set to None, so `import triton` raises ImportError for the whole process and torch's compiler
(dynamo and inductor look for triton at import) sees a CPU-only install, as with torch's CPU
wheels. Why: importing triton maps its LLVM-based library, ~67 MiB resident on the CPU server
(smaps of a SmolLM2 server, 2-core box), that no CPU step ever calls. A process that imported
triton before this module keeps it.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from typing import Any

import torch


def _can_run_triton() -> bool:
    """True under the interpreter, or when torch sees a CUDA (or ROCm) device."""
    return os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()


def triton_installed() -> bool:
    """Whether the triton distribution is installed, whether or not this process may import it
    (the kernel tests use it before running the interpreter in a fresh process)."""
    try:
        importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _load() -> tuple[Any, Any]:
    """(triton, triton.language), or (None, None) when triton is absent or cannot run here."""
    if sys.modules.get("triton") is None and not _can_run_triton():
        sys.modules["triton"] = None       # type: ignore[assignment]  # hidden from the compiler too
        return None, None
    try:
        import triton
        import triton.language as language
    except ImportError:   # CPU-only installs ship without triton
        return None, None
    return triton, language


triton, tl = _load()

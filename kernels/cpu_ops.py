"""The `structserve_cpu` operator library: the C++ CPU kernels of kernels/cpu/*.cpp, built into one
shared library with the system C++ compiler (the one torch.compile's inductor already needs) and
loaded into torch's dispatcher, so eager code and compiled graphs call them as
`torch.ops.structserve_cpu.<name>` (inductor as extern kernels, with no graph break).

The library targets AVX-512 with VNNI (AVX512F/BW/VL, AVX512_VNNI): `cpu_supports_cpu_ops` says
whether this CPU has it. Built once per source set, compiler command and torch version into
`$XDG_CACHE_HOME/structserve/kernels` (`~/.cache/...` by default; `STRUCTSERVE_KERNEL_CACHE`
overrides): about 7-10 s the first time on a machine, then a file load. Each kernel module
(kernels/w4a8_linear.py, kernels/w8a16_linear.py, kernels/paged_attention.py) keeps a pure-torch reference that the tests
compare against and that CPUs without these instructions run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCES = sorted((Path(__file__).with_name("cpu")).glob("*.cpp"))
HEADERS = sorted((Path(__file__).with_name("cpu")).glob("*.h"))   # included by the sources: part of the cache key
REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
_lock = threading.Lock()
_loaded: bool | None = None   # None: not tried yet
_fakes: list[Callable[[], None]] = []


class CpuOpsUnavailable(RuntimeError):
    """The C++ CPU kernels cannot run here: the CPU lacks AVX512-VNNI, or the build failed (the
    message says which)."""


def cpu_supports_cpu_ops() -> bool:
    """Whether /proc/cpuinfo lists every instruction set the library is built for."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return all(flag in flags for flag in REQUIRED_FLAGS)


def register_fake(register: Callable[[], None]) -> None:
    """Have `register` (a function that calls torch.library.register_fake for one operator) run
    once the library is loaded: the shapes torch.compile traces the operator with."""
    _fakes.append(register)
    if _loaded:
        register()


def cpu_ops_loaded() -> bool:
    """True once `load_cpu_ops` has succeeded in this process (no build is attempted)."""
    return bool(_loaded)


def load_cpu_ops() -> None:
    """Build (if not cached) and load the library once per process. Raises CpuOpsUnavailable when
    the CPU lacks the instructions or the compiler fails; the failure is remembered, so later
    calls raise at once."""
    global _loaded
    with _lock:
        if _loaded is None:
            _loaded = False
            if not cpu_supports_cpu_ops():
                raise CpuOpsUnavailable("this CPU lacks AVX512-VNNI (needs " + ", ".join(REQUIRED_FLAGS) + ")")
            torch.ops.load_library(str(_build()))
            for register in _fakes:
                register()
            _loaded = True
        elif not _loaded:
            raise CpuOpsUnavailable("the C++ CPU kernels failed to build or load earlier in this process")


def _cache_root() -> Path:
    """$STRUCTSERVE_KERNEL_CACHE, else $XDG_CACHE_HOME/structserve/kernels, else ~/.cache/structserve/kernels."""
    if os.environ.get("STRUCTSERVE_KERNEL_CACHE"):
        return Path(os.environ["STRUCTSERVE_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "structserve" / "kernels"


def _build() -> Path:
    """The shared library's path, compiling it if absent. Raises CpuOpsUnavailable with the
    compiler's message when the build fails."""
    from torch.utils import cpp_extension
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    command = [os.environ.get("CXX", "g++"), "-O3", "-std=c++20", "-shared", "-fPIC",
               "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma",
               f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *map(str, SOURCES)]
    command += [f"-I{p}" for p in cpp_extension.include_paths()]
    # -fopenmp: at::parallel_for is OpenMP in torch's CPU builds; torch's own libgomp (in its lib
    # folder, already loaded by libtorch_cpu) is the one linked, so both share one thread pool
    command += ["-fopenmp"] + [f"-L{p}" for p in cpp_extension.library_paths()] + ["-lc10", "-ltorch_cpu"]
    command += [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    digest = hashlib.sha256(" ".join([torch.__version__, *command]).encode())
    for source in (*SOURCES, *HEADERS):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    root = _cache_root()
    target = root / f"structserve_cpu_{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    partial = f"{target}.tmp{os.getpid()}"
    logger.info("building the C++ CPU kernels: %s", " ".join(command))
    result = subprocess.run([*command, "-o", partial], capture_output=True, text=True)
    if result.returncode != 0:
        raise CpuOpsUnavailable(f"building {', '.join(s.name for s in SOURCES)} failed:\n{result.stderr[-2000:]}")
    os.replace(partial, target)   # atomic: processes building at once each install a whole file
    return target

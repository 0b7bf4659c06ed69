"""The `structserve_cpu` operator library: the C++ CPU kernels of kernels/cpu/*.cpp, built into one
shared library with the system C++ compiler (the one torch.compile's inductor already needs) and
loaded into torch's dispatcher, so eager code and compiled graphs call them as
`torch.ops.structserve_cpu.<name>` (inductor as extern kernels, with no graph break).

The library targets AVX-512 with VNNI (AVX512F/BW/VL, AVX512_VNNI): `cpu_supports_cpu_ops` says
whether this CPU has it. Built once per source set, compiler command and torch version into
`$XDG_CACHE_HOME/structserve/kernels` (`~/.cache/...` by default; `STRUCTSERVE_KERNEL_CACHE`
overrides): its sources compiled side by side, about 14 s the first time on the project's 2-core
box (the Makefile's install step does it through `main`), then a file load. Each kernel module
(kernels/w4a8_linear.py, kernels/w8a16_linear.py, kernels/paged_attention.py) keeps a pure-torch
reference that the tests compare against and that CPUs without these instructions run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
    """The shared library's path, compiling it if absent: each source to an object in its own
    compiler process (they run side by side, one per core), then one link. Raises
    CpuOpsUnavailable with the compiler's message when the build fails."""
    from torch.utils import cpp_extension
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    compile_flags = [os.environ.get("CXX", "g++"), "-O3", "-std=c++20", "-fPIC",
                     "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma",
                     f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-fopenmp"]
    compile_flags += [f"-I{p}" for p in cpp_extension.include_paths()]
    # -fopenmp: at::parallel_for is OpenMP in torch's CPU builds; torch's own libgomp (in its lib
    # folder, already loaded by libtorch_cpu) is the one linked, so both share one thread pool
    link_flags = ["-shared", "-fopenmp"] + [f"-L{p}" for p in cpp_extension.library_paths()]
    link_flags += ["-lc10", "-ltorch_cpu"] + [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    digest = hashlib.sha256(" ".join([torch.__version__, *compile_flags, *link_flags]).encode())
    for source in (*SOURCES, *HEADERS):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    root = _cache_root()
    target = root / f"structserve_cpu_{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="structserve_cpu_build", dir=root) as work:
        objects = [Path(work) / f"{source.stem}.o" for source in SOURCES]
        logger.info("building the C++ CPU kernels (%d sources side by side): %s", len(SOURCES),
                    " ".join(compile_flags))
        _run_all([[*compile_flags, "-c", str(source), "-o", str(obj)] for source, obj in zip(SOURCES, objects)])
        partial = Path(work) / target.name
        _run_all([[compile_flags[0], *map(str, objects), *link_flags, "-o", str(partial)]])
        os.replace(partial, target)   # atomic: processes building at once each install a whole file
    return target


def _run_all(commands: list[list[str]]) -> None:
    """Run the compiler commands side by side, at most one per usable core at a time. Raises
    CpuOpsUnavailable with a failure's message."""
    def run(cmd: list[str]) -> tuple[list[str], subprocess.CompletedProcess[str]]:
        return cmd, subprocess.run(cmd, capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        for cmd, result in pool.map(run, commands):
            if result.returncode != 0:
                raise CpuOpsUnavailable(
                    f"building the C++ CPU kernels failed ({' '.join(cmd[-3:])}):\n{result.stderr[-2000:]}")


def main() -> int:
    """Build (or find) the library ahead of the first server start (the Makefile's install step
    runs it); prints its path, or why it cannot run here. Exit 0
    either way: CPUs without AVX512-VNNI serve through the torch paths."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not cpu_supports_cpu_ops():
        print("C++ CPU kernels: not built (this CPU lacks AVX512-VNNI); the torch paths serve")
        return 0
    try:
        print(f"C++ CPU kernels: {_build()}")
    except CpuOpsUnavailable as exc:
        print(f"C++ CPU kernels: unavailable, the torch paths serve: {exc}")
    return 0

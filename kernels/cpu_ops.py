"""The `structserve_cpu` operator library: the C++ CPU kernels of kernels/cpu/*.cpp, built into one
shared library with the system C++ compiler (the one torch.compile's inductor already needs) and
loaded into torch's dispatcher, so eager code and compiled graphs call them as
`torch.ops.structserve_cpu.<name>` (inductor as extern kernels, with no graph break).

The library targets AVX-512 with VNNI (AVX512F/BW/VL, AVX512_VNNI): `cpu_supports_cpu_ops` says
whether this CPU has it. A CPU with AVX2 and FMA but not those gets a second library of the same
operator namespace built from kernels/cpu_avx2/*.cpp with the "common" operators, the ones both
libraries define: today all of them, the paged decode and prefill attention and the w4a8 and
w8a16 projections (`load_common_ops`). One process loads one of the two, never both. Built once per
source set, compiler command and torch version into `$XDG_CACHE_HOME/structserve/kernels`
(`~/.cache/...` by default; `STRUCTSERVE_KERNEL_CACHE` overrides): its sources compiled side by
side, about 14 s the first time on the project's 2-core box (the Makefile's install step does it through `main`), then a file load. Each kernel module
(kernels/w4a8_linear.py, kernels/w8a16_linear.py, kernels/paged_attention.py) keeps a pure-torch
reference that the tests compare against and that CPUs without these instructions run.
"""

from __future__ import annotations

import functools
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
# included by the sources: part of the cache key
HEADERS = [*sorted((Path(__file__).with_name("cpu")).glob("*.h")),
           *sorted((Path(__file__).with_name("cpu_avx2")).glob("*.h"))]
REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
ISA_COMPILE_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mfma"]
AVX2_SOURCES = sorted((Path(__file__).with_name("cpu_avx2")).glob("*.cpp"))   # they include ../cpu/*.h
AVX2_REQUIRED_FLAGS = ("avx2", "fma")
AVX2_COMPILE_FLAGS = ["-mavx2", "-mfma"]
_lock = threading.Lock()
_loaded: bool | None = None   # None: not tried yet
_avx2_loaded: bool | None = None
_fakes: list[Callable[[], None]] = []   # shape registrations, run once either library loads


class CpuOpsUnavailable(RuntimeError):
    """The C++ CPU kernels cannot run here: the CPU lacks AVX512-VNNI, or the build failed (the
    message says which)."""


@functools.cache
def _cpu_has(required: tuple[str, ...]) -> bool:
    """Whether /proc/cpuinfo lists every flag of `required` (False where it cannot be read); read
    once per process and flag set (each read took ~0.1 ms, and the wrappers ask on every call)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return all(flag in flags for flag in required)


def cpu_supports_cpu_ops() -> bool:
    """Whether /proc/cpuinfo lists every instruction set the library is built for."""
    return _cpu_has(REQUIRED_FLAGS)


def cpu_supports_common_ops() -> bool:
    """Whether this CPU runs the common operators (paged decode and prefill attention, w4a8 and w8a16
    projections): the AVX-512 library's, or the AVX2 one's."""
    return _cpu_has(REQUIRED_FLAGS) or _cpu_has(AVX2_REQUIRED_FLAGS)


def register_fake(register: Callable[[], None]) -> None:
    """Have `register` (a function that calls torch.library.register_fake for one operator) run
    once either library is loaded (both define every operator): the shapes torch.compile traces
    the operator with."""
    _fakes.append(register)
    if _loaded or _avx2_loaded:
        register()


def cpu_ops_loaded() -> bool:
    """True once `load_cpu_ops` has succeeded in this process (no build is attempted)."""
    return bool(_loaded)


def common_ops_loaded() -> bool:
    """True once either library, and so the common operators (`torch.ops.structserve_cpu.
    paged_decode_attention`, `.paged_prefill_attention`, `.w4a8_linear`, `.w8a16_linear`), is loaded."""
    return bool(_loaded or _avx2_loaded)


def load_common_ops() -> str:
    """Load the library that defines the common operators here, once per process: the AVX-512 one
    (`load_cpu_ops`) where the CPU has AVX512-VNNI, else the AVX2 one (kernels/cpu_avx2), building
    it the first time. Returns "avx512" or "avx2". Raises CpuOpsUnavailable when the CPU has
    neither instruction set or the build or load fails (remembered, as in `load_cpu_ops`)."""
    global _avx2_loaded
    if cpu_supports_cpu_ops():
        load_cpu_ops()
        return "avx512"
    with _lock:
        if _avx2_loaded is None:
            _avx2_loaded = False
            if not _cpu_has(AVX2_REQUIRED_FLAGS):
                raise CpuOpsUnavailable("this CPU lacks AVX2 and FMA for the C++ CPU kernels")
            torch.ops.load_library(str(_build(AVX2_SOURCES, AVX2_COMPILE_FLAGS, "structserve_cpu_avx2")))
            for register in _fakes:
                register()
            _avx2_loaded = True
        elif not _avx2_loaded:
            raise CpuOpsUnavailable("the AVX2 C++ CPU kernels failed to build or load earlier in this process")
    return "avx2"


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
            torch.ops.load_library(str(_build(SOURCES, ISA_COMPILE_FLAGS, "structserve_cpu")))
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


def _build(sources: list[Path], isa_flags: list[str], stem: str) -> Path:
    """The shared library `stem` of `sources` compiled with `isa_flags`: its path, compiling it
    if absent: each source to an object in its own compiler process (they run side by side, one
    per core), then one link. Raises CpuOpsUnavailable with the compiler's message when the build
    fails."""
    from torch.utils import cpp_extension
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    compile_flags = [os.environ.get("CXX", "g++"), "-O3", "-std=c++20", "-fPIC", *isa_flags,
                     f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-fopenmp"]
    compile_flags += [f"-I{p}" for p in cpp_extension.include_paths()]
    # -fopenmp: at::parallel_for is OpenMP in torch's CPU builds; torch's own libgomp (in its lib
    # folder, already loaded by libtorch_cpu) is the one linked, so both share one thread pool
    link_flags = ["-shared", "-fopenmp"] + [f"-L{p}" for p in cpp_extension.library_paths()]
    link_flags += ["-lc10", "-ltorch_cpu"] + [f"-Wl,-rpath,{p}" for p in cpp_extension.library_paths()]
    digest = hashlib.sha256(" ".join([torch.__version__, *compile_flags, *link_flags]).encode())
    for source in (*sources, *HEADERS):
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    root = _cache_root()
    target = root / f"{stem}_{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="structserve_cpu_build", dir=root) as work:
        objects = [Path(work) / f"{source.stem}.o" for source in sources]
        logger.info("building the C++ CPU kernels %s (%d sources side by side): %s", stem, len(sources),
                    " ".join(compile_flags))
        _run_all([[*compile_flags, "-c", str(source), "-o", str(obj)] for source, obj in zip(sources, objects)])
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
    either way: CPUs without AVX512-VNNI run the AVX2 library where they have AVX2 and FMA, and
    the torch paths otherwise."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if cpu_supports_cpu_ops():
            print(f"C++ CPU kernels: {_build(SOURCES, ISA_COMPILE_FLAGS, 'structserve_cpu')}")
        elif cpu_supports_common_ops():
            print("C++ CPU kernels: the AVX2 library (this CPU lacks AVX512-VNNI): "
                  f"{_build(AVX2_SOURCES, AVX2_COMPILE_FLAGS, 'structserve_cpu_avx2')}")
        else:
            print("C++ CPU kernels: not built (this CPU lacks AVX512-VNNI and AVX2); the torch paths serve")
    except CpuOpsUnavailable as exc:
        print(f"C++ CPU kernels: unavailable, the torch paths serve: {exc}")
    return 0

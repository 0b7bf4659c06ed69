"""kernels/cpu_ops.py's build step (`main`, run by the Makefile's install): it reports the library
it built or found, and a failed build says why, exits 0 and leaves nothing in the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.cpu_ops import cpu_supports_cpu_ops

ROOT = Path(__file__).resolve().parents[2]
MAIN = "import sys; from kernels.cpu_ops import main; sys.exit(main())"
NEEDS_CPU_OPS = pytest.mark.skipif(not cpu_supports_cpu_ops(), reason="this CPU lacks AVX512-VNNI for the C++ kernels")


def build_step(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", MAIN], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)


@NEEDS_CPU_OPS
def test_the_build_step_reports_the_library_it_loads() -> None:
    result = build_step({})        # the suite's own runs have built it into the default cache already
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip().removeprefix("C++ CPU kernels: "))
    assert path.suffix == ".so" and path.is_file(), result.stdout


@NEEDS_CPU_OPS
def test_a_failed_build_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    result = build_step({"CXX": "false", "STRUCTSERVE_KERNEL_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "unavailable, the torch paths serve" in result.stdout and "failed" in result.stdout, result.stdout
    assert list(tmp_path.iterdir()) == []


WITHOUT_VNNI = ("import sys, kernels.cpu_ops as ops; ops.cpu_supports_cpu_ops = lambda: False; "
                "sys.exit(ops.main())")


def test_without_vnni_the_build_step_says_so_and_builds_nothing(tmp_path: Path) -> None:
    """On any CPU: the step as it runs where /proc/cpuinfo lacks AVX512-VNNI (the check replaced)."""
    result = subprocess.run([sys.executable, "-c", WITHOUT_VNNI], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "STRUCTSERVE_KERNEL_CACHE": str(tmp_path)}, timeout=120)
    assert result.returncode == 0 and "lacks AVX512-VNNI" in result.stdout, result.stdout
    assert list(tmp_path.iterdir()) == []

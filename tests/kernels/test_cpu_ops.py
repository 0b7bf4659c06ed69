"""kernels/cpu_ops.py's build step (`main`, run by the Makefile's install): it reports the library
it built or found (the AVX-512 one, or the AVX2 one where the CPU lacks AVX512-VNNI),
and a failed build says why, exits 0 and leaves nothing in the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.cpu_ops import cpu_supports_common_ops

ROOT = Path(__file__).resolve().parents[2]
MAIN = "import sys; from kernels.cpu_ops import main; sys.exit(main())"
NEEDS_CPU_OPS = pytest.mark.skipif(not cpu_supports_common_ops(),
                                   reason="this CPU has neither AVX512-VNNI nor AVX2 and FMA for the C++ kernels")


def build_step(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", MAIN], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=600)


@NEEDS_CPU_OPS
def test_the_build_step_reports_the_library_it_loads() -> None:
    result = build_step({})        # the suite's own runs have built it into the default cache already
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip().split(" ")[-1])
    assert path.suffix == ".so" and path.is_file(), result.stdout


@NEEDS_CPU_OPS
def test_a_failed_build_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    result = build_step({"CXX": "false", "STRUCTSERVE_KERNEL_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "unavailable, the torch paths serve" in result.stdout and "failed" in result.stdout, result.stdout
    assert list(tmp_path.iterdir()) == []


AVX2_ONLY = """
import sys, torch, kernels.cpu_ops as ops
ops.cpu_supports_cpu_ops = lambda: False          # as where /proc/cpuinfo lacks AVX512-VNNI
ops.main()
assert ops.load_common_ops() == "avx2" and not ops.cpu_ops_loaded()
from kernels.paged_attention import paged_decode_attention, paged_decode_reduction
gen = torch.Generator().manual_seed(0)
k_cache, v_cache = torch.randn(40, 16, 3, 64, generator=gen), torch.randn(40, 16, 3, 64, generator=gen)
q = torch.randn(4, 9, 64, generator=gen)
tables = torch.randperm(39, generator=gen)[:36].view(4, 9).to(torch.int32)
seq_lens = torch.tensor([1, 17, 100, 140], dtype=torch.int32)   # a tail in a block, several blocks
got = paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, 0.125)
want = paged_decode_reduction(q, k_cache, v_cache, tables, seq_lens, 0.125)
print("attention max diff", float((got - want).abs().max()))
from kernels.w4a8_linear import pack_w4a8, w4a8_linear, w4a8_linear_ref
# every x-row tile (4 + 3, 2, 1), a last half block of 5 rows and one of 0 (N = 21, 32), one group
for m, k, n in ((7, 96, 21), (2, 32, 32), (1, 576, 40), (13, 160, 8)):
    qvals = torch.randint(0, 16, (n, k), generator=gen)
    scales, zeros = torch.rand(n, k // 32, generator=gen) * 0.02, torch.randn(n, k // 32, generator=gen) * 0.01
    weight = pack_w4a8(qvals, scales, zeros)
    x = torch.randn(m, k, generator=gen)
    x[0, :32] = 0                                                  # an all-zero group: step 0
    got, want = w4a8_linear(x, *weight), w4a8_linear_ref(x, *weight)
    alone = torch.cat([w4a8_linear(x[i:i + 1], *weight) for i in range(m)])
    assert torch.equal(got, alone), "a row's result depends on its batch"
    print("w4a8 relative diff", float((got - want).abs().max() / want.abs().max()))
from kernels.w8a16_linear import pack_w8a16, w8a16_linear, w8a16_linear_ref
for m, k, n in ((5, 96, 21), (1, 576, 40), (4, 32, 8)):           # tiles of 2 and 1, half blocks
    weight = pack_w8a16(torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8), torch.rand(n, generator=gen))
    x = torch.randn(m, k, generator=gen)
    x[0, :32] = 0
    got, want = w8a16_linear(x, *weight), w8a16_linear_ref(x, *weight)
    alone = torch.cat([w8a16_linear(x[i:i + 1], *weight) for i in range(m)])
    assert torch.equal(got, alone), "a row's result depends on its batch"
    print("w8a16 relative diff", float((got - want).abs().max() / want.abs().max()))
"""


@pytest.mark.skipif(not cpu_supports_common_ops(), reason="this CPU lacks AVX2 and FMA")
def test_without_vnni_the_build_step_builds_the_avx2_kernels_and_they_match(tmp_path: Path) -> None:
    """On any CPU with AVX2 (AVX-512 ones included, the VNNI check replaced): the step builds the
    AVX2 library only; its decode attention gives the torch reduction's numbers, and its w4a8 and
    w8a16 projections their references', each row the same alone as in its batch."""
    result = subprocess.run([sys.executable, "-c", AVX2_ONLY], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "STRUCTSERVE_KERNEL_CACHE": str(tmp_path)}, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "the AVX2 library" in result.stdout, out
    assert [p.name.split("_")[2] for p in tmp_path.iterdir()] == ["avx2"], list(tmp_path.iterdir())
    diffs = [line.split(" ") for line in result.stdout.splitlines() if " diff " in line]
    assert [d[0] for d in diffs] == ["attention"] + ["w4a8"] * 4 + ["w8a16"] * 3, out
    assert float(diffs[0][-1]) < 1e-5 and all(float(d[-1]) < 1e-6 for d in diffs[1:]), out


NEITHER = ("import sys, kernels.cpu_ops as ops; ops.cpu_supports_cpu_ops = lambda: False; "
           "ops.cpu_supports_common_ops = lambda: False; sys.exit(ops.main())")


def test_without_vnni_or_avx2_the_build_step_says_so_and_builds_nothing(tmp_path: Path) -> None:
    """On any CPU: the step as it runs where /proc/cpuinfo lacks both (the checks replaced)."""
    result = subprocess.run([sys.executable, "-c", NEITHER], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "STRUCTSERVE_KERNEL_CACHE": str(tmp_path)}, timeout=120)
    assert result.returncode == 0 and "lacks AVX512-VNNI and AVX2" in result.stdout, result.stdout
    assert list(tmp_path.iterdir()) == []

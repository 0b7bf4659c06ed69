"""kernels/int8_linear.py: the int8 weight-only C++ kernel (float32 activations) against its torch
reference, on every x-row branch, odd shapes, thread counts and batch compositions.

The kernel runs where the CPU has AVX512-VNNI (kernels/cpu_ops.py's library; skipped elsewhere,
saying so); the reference is checked everywhere."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import cpu_supports_cpu_ops, load_cpu_ops
from kernels.int8_linear import int8_linear, int8_linear_ref

NEEDS_CPU_OPS = pytest.mark.skipif(not cpu_supports_cpu_ops(), reason="this CPU lacks AVX512-VNNI for the C++ kernels")
# (M, K, N): x-row branches 1..4 and 4 + rest, K with a tail of 1..31 inputs past a multiple of 32, N
# off the 2- and 4-row steps and the 64-row tasks
SHAPES = [(1, 576, 49), (1, 32, 1), (2, 100, 37), (3, 16, 7), (4, 576, 130), (5, 48, 64), (6, 200, 3),
          (7, 1536, 65), (8, 576, 1000), (9, 33, 5)]


def random_int8(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight [N, K] in -127..127, bf16 scales [N]) of a random projection."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randint(-127, 128, (n, k), generator=gen).to(torch.int8)
    return weight, (torch.rand(n, generator=gen) * 0.01 + 1e-4).to(torch.bfloat16)


def test_reference_is_the_product_of_the_held_weight() -> None:
    weight, scales = random_int8(9, 64, seed=1)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    held = weight.float() * scales.float()[:, None]
    torch.testing.assert_close(int8_linear_ref(x, weight, scales), x @ held.t(), atol=1e-5, rtol=1e-5)


@NEEDS_CPU_OPS
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_kernel_matches_the_reference(m: int, k: int, n: int) -> None:
    weight, scales = random_int8(n, k, seed=m * 1000 + k + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n)) * 3
    out = int8_linear(x, weight, scales)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    torch.testing.assert_close(out, int8_linear_ref(x, weight, scales), atol=1e-4, rtol=1e-5)


@NEEDS_CPU_OPS
def test_a_row_gives_the_same_bits_in_any_batch_and_on_any_thread_count() -> None:
    weight, scales = random_int8(300, 576, seed=2)
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(2))
    together = int8_linear(x, weight, scales)
    for m in range(9):
        assert torch.equal(int8_linear(x[m:m + 1], weight, scales)[0], together[m])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = int8_linear(x, weight, scales)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, together)


@NEEDS_CPU_OPS
def test_kernel_refuses_bad_inputs_with_its_reason() -> None:
    weight, scales = random_int8(8, 64, seed=3)
    with pytest.raises(RuntimeError, match="x must be float32"):
        int8_linear(torch.randn(1, 64, dtype=torch.bfloat16), weight, scales)
    with pytest.raises(RuntimeError, match="weight is \\[N, K\\]"):
        int8_linear(torch.randn(1, 65), weight, scales)
    with pytest.raises(RuntimeError, match="scales must be contiguous bf16 \\[N\\]"):
        int8_linear(torch.randn(1, 64), weight, scales[:4])
    with pytest.raises(RuntimeError, match="weight must be contiguous int8"):
        int8_linear(torch.randn(1, 64), weight.t(), scales)


@NEEDS_CPU_OPS
def test_inductor_calls_the_operator_without_a_graph_break() -> None:
    load_cpu_ops()
    weight, scales = random_int8(40, 96, seed=4)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.structserve_cpu.int8_linear(torch.relu(x), weight, scales) * 2

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for rows in (1, 3, 6):
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(compiled(x), f(x), atol=0, rtol=0)

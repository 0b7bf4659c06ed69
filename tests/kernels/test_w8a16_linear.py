"""kernels/w8a16_linear.py: the int8 C++ kernel (activations as two int8 levels per group) against its
torch reference, on every x-row branch, odd shapes, thread counts and batch compositions; the layout
round trip and the row lookup a tied embedding reads through.

The kernel runs where the CPU has AVX512-VNNI (kernels/cpu_ops.py's library; skipped elsewhere,
saying so); the reference and the layout are checked everywhere."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import cpu_supports_common_ops, load_common_ops
from kernels.w8a16_linear import (
    pack_w8a16,
    two_level_activations,
    unpack_w8a16,
    w8a16_linear,
    w8a16_linear_ref,
    w8a16_rows,
)

NEEDS_CPU_OPS = pytest.mark.skipif(not cpu_supports_common_ops(),
                                   reason="this CPU lacks AVX512-VNNI and AVX2 for the C++ kernels")
# (M, K, N): x-row tiles 1..4 and 4 + rest; N off the 16-row blocks (a masked last block) and below one
SHAPES = [(1, 576, 49), (1, 32, 1), (2, 96, 37), (3, 64, 7), (4, 576, 130), (5, 32, 64), (6, 160, 3),
          (7, 1536, 65), (8, 576, 1000), (9, 64, 5)]


def random_int8(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight [N, K] in -127..127, float32 scales [N]) of a random projection."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randint(-127, 128, (n, k), generator=gen).to(torch.int8)
    return weight, torch.rand(n, generator=gen) * 0.01 + 1e-4


def test_layout_round_trips_and_rows_read_back() -> None:
    weight, scales = random_int8(37, 64, seed=1)
    packed = pack_w8a16(weight, scales)
    assert packed.packed.shape == (3, 64 * 16) and packed.scales.shape == (3, 16) and packed.out_features == 37
    qvals, row_scales = unpack_w8a16(packed)
    assert torch.equal(qvals, weight) and torch.equal(row_scales, scales.to(torch.bfloat16))
    ids = torch.tensor([36, 0, 15, 16, 17, 36])
    assert torch.equal(w8a16_rows(packed.packed, ids), weight[ids])
    assert torch.all(packed.packed.view(3, 16, 16, 4)[2, :, 5:, :] == 128)   # rows past N: weight 0


def test_two_levels_hold_the_activations_to_about_15_bits() -> None:
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(2)) * 5
    q1, s1, q2, s2 = two_level_activations(x)
    assert q1.abs().max() <= 127 and q2.abs().max() <= 127 and torch.all(s2 <= s1 / 250)
    approx = (q1 * s1 + q2 * s2).reshape(4, 96)
    step = s1.expand(-1, -1, 32).reshape(4, 96)
    assert torch.all((approx - x).abs() <= step / 250)


def test_reference_is_the_product_of_the_held_weight() -> None:
    weight, scales = random_int8(9, 64, seed=3)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    held = weight.float() * scales.to(torch.bfloat16).float()[:, None]
    torch.testing.assert_close(w8a16_linear_ref(x, *pack_w8a16(weight, scales)), x @ held.t(), atol=1e-4, rtol=1e-4)


def test_pack_refuses_what_the_kernel_cannot_hold() -> None:
    weight, scales = random_int8(8, 64, seed=4)
    with pytest.raises(ValueError, match="divisible by 32"):
        pack_w8a16(weight[:, :48], scales)
    with pytest.raises(ValueError, match="must be int8"):
        pack_w8a16(weight.to(torch.int16), scales)
    with pytest.raises(ValueError, match="scales must be"):
        pack_w8a16(weight, scales[:4])


@NEEDS_CPU_OPS
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_kernel_matches_the_reference(m: int, k: int, n: int) -> None:
    weight, scales = random_int8(n, k, seed=m * 1000 + k + n)
    packed = pack_w8a16(weight, scales)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n)) * 3
    out = w8a16_linear(x, *packed)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    expected = w8a16_linear_ref(x, *packed)
    # float32 sums of K / 32 group terms: an error of a few float32 steps of the largest output
    torch.testing.assert_close(out, expected, atol=1e-5 * float(expected.abs().max()), rtol=1e-5)


@NEEDS_CPU_OPS
def test_a_row_gives_the_same_bits_in_any_batch_and_on_any_thread_count() -> None:
    packed = pack_w8a16(*random_int8(300, 576, seed=5))
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(5))
    together = w8a16_linear(x, *packed)
    for m in range(9):
        assert torch.equal(w8a16_linear(x[m:m + 1], *packed)[0], together[m])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = w8a16_linear(x, *packed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, together)


@NEEDS_CPU_OPS
def test_kernel_refuses_bad_inputs_with_its_reason() -> None:
    packed, scales, n = pack_w8a16(*random_int8(8, 64, seed=6))
    with pytest.raises(RuntimeError, match="x must be float32"):
        w8a16_linear(torch.randn(1, 64, dtype=torch.bfloat16), packed, scales, n)
    with pytest.raises(RuntimeError, match="K must be a multiple of 32"):
        w8a16_linear(torch.randn(1, 65), packed, scales, n)
    with pytest.raises(RuntimeError, match="packed is contiguous uint8"):
        w8a16_linear(torch.randn(1, 96), packed, scales, n)
    with pytest.raises(RuntimeError, match="scales are contiguous bf16"):
        w8a16_linear(torch.randn(1, 64), packed, scales.float(), n)


@NEEDS_CPU_OPS
def test_inductor_calls_the_operator_without_a_graph_break() -> None:
    load_common_ops()
    packed, scales, n = pack_w8a16(*random_int8(40, 96, seed=7))

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.structserve_cpu.w8a16_linear(torch.relu(x), packed, scales, n) * 2

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for rows in (1, 3, 6):
        x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(compiled(x), f(x), atol=0, rtol=0)

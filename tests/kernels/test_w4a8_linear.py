"""kernels/w4a8_linear.py: the W4A8 C++ kernel against its torch reference, the reference against
the float product of the weight it holds, and the packed layout.

The kernel runs where the CPU has AVX512-VNNI or AVX2 and FMA (the library this CPU loads; the tests
that need it say so when skipped; tests/kernels/test_cpu_ops.py also runs the AVX2 kernel on AVX-512
CPUs); the reference and the layout are checked everywhere.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import cpu_supports_common_ops, load_common_ops
from kernels.w4a8_linear import (
    pack_w4a8,
    quantize_activations,
    unpack_w4a8,
    w4a8_linear,
    w4a8_linear_ref,
)

NEEDS_KERNEL = pytest.mark.skipif(not cpu_supports_common_ops(),
                                  reason="this CPU lacks AVX512-VNNI and AVX2 for the W4A8 kernel")
# (M, K, N): every x-row branch of the kernel (1, 2, 3, 4 and 4 + rest), K of one group and odd
# group counts, N off the 16-row blocks (a last, partial block) and on them
SHAPES = [(1, 64, 5), (1, 576, 960), (2, 128, 17), (3, 96, 33), (4, 1536, 64), (5, 576, 19), (6, 256, 48),
          (7, 32, 3), (8, 576, 3072), (9, 160, 1)]


def random_weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(4-bit values [N, K], scales and zeros [N, K / 32] rounded to bf16) of a random weight."""
    gen = torch.Generator().manual_seed(seed)
    qvals = torch.randint(0, 16, (n, k), generator=gen)
    scales = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).to(torch.bfloat16).float()
    zeros = (torch.randn(n, k // 32, generator=gen) * 0.01).to(torch.bfloat16).float()
    return qvals, scales, zeros


def held_weight(qvals: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """float32 [N, K]: (q - 8) * scale + zero."""
    return (qvals.float() - 8) * scales.repeat_interleave(32, 1) + zeros.repeat_interleave(32, 1)


def test_each_int32_lane_holds_one_row_and_four_inputs_per_nibble() -> None:
    qvals, scales, zeros = random_weight(20, 64, seed=4)
    packed = pack_w4a8(qvals, scales, zeros).packed
    for block, octet, row, t in [(0, 0, 0, 0), (0, 3, 15, 2), (1, 7, 3, 3), (1, 5, 4, 1)]:
        byte = int(packed[block, 64 * octet + 4 * row + t])
        n = 16 * block + row
        assert byte & 0x0F == (int(qvals[n, 8 * octet + t]) if n < 20 else 0)
        assert byte >> 4 == (int(qvals[n, 8 * octet + 4 + t]) if n < 20 else 0)


@pytest.mark.parametrize(("n", "k"), [(7, 32), (16, 128), (33, 192), (5, 576)])
def test_pack_unpacks_to_the_same_values(n: int, k: int) -> None:
    qvals, scales, zeros = random_weight(n, k, seed=k)
    weight = pack_w4a8(qvals, scales, zeros)
    blocks = -(-n // 16)
    assert weight.packed.dtype == torch.uint8 and weight.packed.shape == (blocks, k * 8)
    assert weight.scales.dtype == torch.bfloat16 and weight.scales.shape == (blocks, k // 32, 16)
    assert weight.out_features == n
    held, held_scales, held_zeros = unpack_w4a8(weight)
    assert torch.equal(held, qvals.to(torch.uint8))
    assert torch.equal(held_scales.float(), scales) and torch.equal(held_zeros.float(), zeros)


def test_pack_refuses_what_the_kernel_cannot_hold() -> None:
    qvals, scales, zeros = random_weight(4, 48, seed=0)
    with pytest.raises(ValueError, match="divisible by 32"):
        pack_w4a8(qvals, scales, zeros)
    qvals, scales, zeros = random_weight(4, 64, seed=0)
    with pytest.raises(ValueError, match="0..15"):
        pack_w4a8(qvals + 1, scales, zeros)
    with pytest.raises(ValueError, match=r"must be \[4, 2\]"):
        pack_w4a8(qvals, scales[:, :1], zeros)


def test_activations_round_per_group_within_half_a_step() -> None:
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1)) * 4
    x[1, 32:64] = 0      # an all-zero group: step 0, values 0, no NaN
    qx, step = quantize_activations(x)
    assert qx.abs().max() <= 127 and bool((qx == qx.round()).all())
    assert float(step[1, 1]) == 0 and bool((qx[1, 1] == 0).all())
    error = (qx * step).reshape(3, 128) - x
    assert bool((error.abs() <= step.repeat_interleave(32, 1).reshape(3, 128) / 2 + 1e-6).all())
    # the largest magnitude of each group is exact: +-127 steps
    assert bool((qx.abs().amax(-1)[step.squeeze(-1) > 0] == 127).all())


@pytest.mark.parametrize(("m", "k", "n"), [(1, 64, 5), (3, 192, 33), (8, 576, 96)])
def test_reference_tracks_the_float_product_within_the_activation_rounding(m: int, k: int, n: int) -> None:
    qvals, scales, zeros = random_weight(n, k, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k))
    weight = held_weight(qvals, scales, zeros)
    out = w4a8_linear_ref(x, *pack_w4a8(qvals, scales, zeros))
    exact = x.double() @ weight.double().t()
    # each input moves by at most half its group's step; the product by sum |w| * step / 2
    _, step = quantize_activations(x)
    lane_step = step.expand(m, k // 32, 32).reshape(m, k).double()
    bound = (lane_step / 2) @ weight.double().abs().t()
    assert bool(((out.double() - exact).abs() <= bound + 1e-5).all())
    assert float((out.double() - exact).norm() / exact.norm()) < 0.02


@NEEDS_KERNEL
@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_kernel_matches_the_reference(m: int, k: int, n: int) -> None:
    qvals, scales, zeros = random_weight(n, k, seed=m * 1000 + k + n)
    packed = pack_w4a8(qvals, scales, zeros)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n)) * 3
    x[0, :32] = 0   # an all-zero group
    out = w4a8_linear(x, *packed)
    expected = w4a8_linear_ref(x, *packed)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@NEEDS_KERNEL
def test_kernel_is_the_same_on_one_thread_and_on_every_thread() -> None:
    qvals, scales, zeros = random_weight(3072, 576, seed=5)
    packed = pack_w4a8(qvals, scales, zeros)
    x = torch.randn(6, 576, generator=torch.Generator().manual_seed(5))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = w4a8_linear(x, *packed)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, w4a8_linear(x, *packed))   # rows are split, never a row's sum


@NEEDS_KERNEL
def test_a_row_gives_the_same_bits_in_any_batch() -> None:
    """Each (x row, weight row) pair runs the same operations whatever M is: a request's
    projection does not depend on the rows batched with it."""
    qvals, scales, zeros = random_weight(200, 576, seed=6)
    packed = pack_w4a8(qvals, scales, zeros)
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(6))
    together = w4a8_linear(x, *packed)
    for m in range(9):
        assert torch.equal(w4a8_linear(x[m:m + 1], *packed)[0], together[m])
    assert torch.equal(w4a8_linear(x[2:5], *packed), together[2:5])


@NEEDS_KERNEL
def test_kernel_refuses_bad_inputs_with_its_reason() -> None:
    qvals, scales, zeros = random_weight(8, 128, seed=2)
    packed, packed_scales, packed_zeros, n = pack_w4a8(qvals, scales, zeros)
    with pytest.raises(RuntimeError, match="x must be float32"):
        w4a8_linear(torch.randn(1, 128, dtype=torch.bfloat16), packed, packed_scales, packed_zeros, n)
    with pytest.raises(RuntimeError, match=r"packed is uint8 \[ceil\(N / 16\), K \* 8\]"):
        w4a8_linear(torch.randn(1, 192), packed, packed_scales, packed_zeros, n)
    with pytest.raises(RuntimeError, match=r"packed is uint8"):
        w4a8_linear(torch.randn(1, 128), packed, packed_scales, packed_zeros, 17)   # 2 blocks, 1 held
    with pytest.raises(RuntimeError, match="multiple of 32"):
        w4a8_linear(torch.randn(1, 100), packed, packed_scales, packed_zeros, n)


@NEEDS_KERNEL
def test_inductor_calls_the_operator_without_a_graph_break_for_any_row_count() -> None:
    load_common_ops()
    qvals, scales, zeros = random_weight(64, 128, seed=3)
    packed = pack_w4a8(qvals, scales, zeros)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.structserve_cpu.w4a8_linear(torch.relu(x), *packed) * 2

    compiled = torch.compile(f, fullgraph=True, dynamic=True)
    for rows in (1, 3, 6):
        x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
        torch.testing.assert_close(compiled(x), f(x), atol=0, rtol=0)

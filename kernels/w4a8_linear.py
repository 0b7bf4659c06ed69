"""W4A8 projection on AVX512-VNNI and AVX2 CPUs: 4-bit weight groups times int8 activations.

`y = x @ W.T` with W `[N, K]` held as 4-bit values q in 0..15 per group of 32 inputs with a bf16
scale and zero each (w = (q - 8) * scale + zero, engine/models/quantized_tensor.py's convention),
and x `[M, K]` float32 quantized per group of 32 to int8 (step = max |x| / 127, round to nearest)
inside the call. Per group: scale * step * sum((q - 8) * qx) + zero * sum(x), the second term
with the exact float sum of x. This is llama.cpp's Q4_1 x Q8_1 dot-product scheme (ggml-quants.c);
the C++ kernels (kernels/cpu/w4a8.cpp with vpdpbusd, kernels/cpu_avx2/w4a8.cpp with vpmaddubsw and
vpmaddwd on the same layout, for CPUs without AVX512-VNNI) are ours.

Why: torch's weight-only int4 kernel (`_weight_int4pack_mm_for_cpu`) dequantizes to bf16 and is
compute-bound at one row; integer dot products over the packed nibbles read the same bytes with
fewer instructions (shared/research/cpu-performance.md §3). The layout puts one weight row in each
int32 lane, so a vpdpbusd adds 4 products to 16 rows with the activations broadcast and no
horizontal sums are needed; a row's result does not depend on the batch around it.

Measured on the project's Intel AVX-512 (VNNI, bf16, AMX) box, 2 threads, one row, SmolLM2's 120
layer projections in model order (66 MB streamed from memory, one sitting): 2.45 ms a pass against
4.47 for the previous layout (pairs of groups per vector, a horizontal sum per row); one layer's 4
projections with the weights in cache 50 against 132 us. The box read 41-55 GB/s in that sitting.

On the project's AMD AVX2 box (no VNNI), 2 threads, weights in cache, the AVX2 kernel against
torch's float32 linear (oneDNN) and tinygemm for SmolLM2's shapes (576 -> 1536, 1536 -> 576,
576 -> 960), ms: 1 row 0.024-0.038 (tinygemm 0.071-0.101, float32 0.10-0.15); 8 rows 0.066-0.075
(tinygemm 0.19-0.24, float32 0.22-0.31); 32 rows 0.16-0.35, float32 1.9-2.0x that; 300 rows
1.5-3.4, float32 1.1-1.4x that.

`w4a8_linear_ref` is the specification (pure torch, any CPU); `w4a8_linear` runs the kernel, the
`torch.ops.structserve_cpu.w4a8_linear` operator of either library of kernels/cpu_ops.py.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.cpu_ops import load_common_ops, register_fake

GROUP = 32
BLOCK = 16     # weight rows per packed block: one int32 lane of vpdpbusd each


class W4A8Weight(NamedTuple):
    """A weight in the kernel's layout (`pack_w4a8`); `w4a8_linear(x, *weight)` runs it.

    packed: uint8 `[ceil(N / 16), K * 8]`: per block of 16 rows, K / 8 vectors of 64 bytes (one
        per input octet j, inputs 8j .. 8j + 7): byte 4r + t holds row r's input 8j + t in its low
        nibble and 8j + 4 + t in its high one (rows past N are zeros).
    scales, zeros: bf16 `[ceil(N / 16), K / 32, 16]`: per block and group, its 16 rows'.
    out_features: N.
    """

    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    out_features: int


def pack_w4a8(qvals: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> W4A8Weight:
    """The kernel's layout (`W4A8Weight`) of a 4-bit weight: `qvals` `[N, K]` integers in 0..15,
    `scales` / `zeros` `[N, K / 32]` float (rounded to bf16 here). Raises ValueError unless K is a
    multiple of 32, the values fit 4 bits and scales and zeros are `[N, K / 32]`."""
    n, k = qvals.shape
    if k % GROUP:
        raise ValueError(f"W4A8 needs in_features divisible by 32, got {k}")
    if qvals.numel() and (int(qvals.min()) < 0 or int(qvals.max()) > 15):
        raise ValueError("W4A8 weights must be 4-bit values in 0..15")
    if scales.shape != (n, k // GROUP) or zeros.shape != scales.shape:
        raise ValueError(f"scales and zeros must be [{n}, {k // GROUP}], got {tuple(scales.shape)}, "
                         f"{tuple(zeros.shape)}")
    blocks = -(-n // BLOCK)
    pad = blocks * BLOCK - n
    q = torch.nn.functional.pad(qvals.to(torch.uint8), (0, 0, 0, pad))          # [N', K]
    # [blocks, row, octet, half, t] -> [blocks, octet, row, t, half]: half 0 low nibble, 1 high
    q = q.reshape(blocks, BLOCK, k // 8, 2, 4).permute(0, 2, 1, 4, 3)
    packed = (q[..., 0] | (q[..., 1] << 4)).reshape(blocks, k * 8).contiguous()

    def lines(t: torch.Tensor) -> torch.Tensor:
        t = torch.nn.functional.pad(t.to(torch.bfloat16), (0, 0, 0, pad))
        return t.reshape(blocks, BLOCK, k // GROUP).transpose(1, 2).contiguous()

    return W4A8Weight(packed, lines(scales), lines(zeros), n)


def unpack_w4a8(weight: W4A8Weight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(4-bit values uint8 `[N, K]` in input order, scales and zeros bf16 `[N, K / 32]`) of a
    weight `pack_w4a8` packed."""
    packed, scales, zeros, n = weight
    blocks, k = packed.shape[0], packed.shape[1] // 8
    v = packed.reshape(blocks, k // 8, BLOCK, 4)
    q = torch.stack([v & 0x0F, v >> 4], dim=-1)                                  # [b, octet, row, t, half]
    qvals = q.permute(0, 2, 1, 4, 3).reshape(blocks * BLOCK, k)[:n]

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.transpose(1, 2).reshape(blocks * BLOCK, k // GROUP)[:n]

    return qvals, rows(scales), rows(zeros)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(qx float `[M, K // 32, 32]` with integer values in -127..127, step float `[M, K // 32, 1]`)
    of float32 `x` `[M, K]`: per group of 32, step = max |x| / 127, qx = round-half-even(x / step)
    (0 where the group is all zeros)."""
    groups = x.float().reshape(x.shape[0], -1, GROUP)
    step = groups.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(step > 0, 1 / step, torch.zeros_like(step))
    return torch.round(groups * inverse), step


def w4a8_linear_ref(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    out_features: int) -> torch.Tensor:
    """Reference of `w4a8_linear` in float64 then float32: `x` float32 `[M, K]`, the weight as
    `pack_w4a8` returns it; returns float32 `[M, N]`. It unpacks the layout, so it also checks
    `pack_w4a8`."""
    qvals, row_scales, row_zeros = unpack_w4a8(W4A8Weight(packed, scales, zeros, out_features))
    n, k = qvals.shape
    q = qvals.reshape(n, k // GROUP, GROUP).double() - 8                       # [N, G, 32]
    qx, step = quantize_activations(x)                                        # [M, G, 32], [M, G, 1]
    integer = torch.einsum("ngi,mgi->mng", q, qx.double())                    # [M, N, G]
    scaled = integer * row_scales.double()[None] * step.double().squeeze(-1)[:, None, :]
    group_sum = x.double().reshape(x.shape[0], -1, GROUP).sum(-1)             # [M, G]
    return (scaled.sum(-1) + group_sum @ row_zeros.double().t()).float()


def w4a8_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                out_features: int) -> torch.Tensor:
    """`w4a8_linear_ref` through the C++ kernel: float32 `[M, K]` -> float32 `[M, N]`, run on
    torch's intra-op threads (blocks of 16 weight rows split between them). Raises
    CpuOpsUnavailable where the kernel cannot be loaded, RuntimeError for shapes or dtypes
    that do not match the layout."""
    load_common_ops()
    return torch.ops.structserve_cpu.w4a8_linear(x, packed, scales, zeros, out_features)


def _register_fake() -> None:
    """Shapes for torch.compile's tracing: `[M, K]` -> `[M, out_features]` float32."""
    @torch.library.register_fake("structserve_cpu::w4a8_linear")
    def _(x, packed, scales, zeros, out_features):
        return x.new_empty((x.shape[0], out_features))


register_fake(_register_fake)

"""INT8 projection on AVX512-VNNI and AVX2 CPUs: int8 weight rows times activations held as
two int8 levels per group of 32 (about 15 bits), summed with integer dot products.

`y = (x @ W.T) * scale` with W `[N, K]` int8 per output channel and a bf16 scale per row
(engine/models/quantized_tensor.py's `Int8Channels`) and x `[M, K]` float32. Inside the call each
group of 32 inputs is quantized to int8 (step s1 = max |x| / 127, round half to even), then its
rounding residual x - q1 * s1 is quantized the same way (step s2 <= s1 / 254); per group the two
integer dot products are scaled by s1 and s2 and summed, then the row's scale is applied. The C++
kernel (kernels/cpu/w8a16.cpp) runs the dot products with vpdpbusd over a layout with one weight
row per int32 lane (the layout of kernels/w4a8_linear.py, one byte per weight); kernels/
cpu_avx2/w8a16.cpp runs them with vpmaddubsw and vpmaddwd on the same layout for CPUs without
AVX512-VNNI (llama.cpp's sign trick keeps the int16 pairs from overflowing). The scheme and the
code are ours. On the project's AMD AVX2 box, 2 threads, SmolLM2's LM head (49152 x 576) took
3.7 ms at 1 row, 9.5 at 8 and 20.6 at 32: about half of torch's `_weight_int8pack_mm` at every
row count, and less than the float32 product (oneDNN) up to 32 rows (measured while other work
ran; ratios, not absolute times).

Why: widening int8 weights to float32 in registers (torch's `_weight_int8pack_mm`, our earlier
w8a32 kernel) is bound by the widening, not by the reads: about 13-22 GB/s on the project's
2-core boxes for SmolLM2's LM head (49152 x 576, the largest single projection), where the box
reads about 40 GB/s. One int8 level alone is not accurate enough for a head: top-1 agreed with
the exact product on 98.0 % of 3,000 real positions of SmolLM2 (the head's bf16 copy: 97.6 %);
two levels agreed on 100 %, the largest logit difference 0.0024.

The layout is shared with the token embedding when the head is tied: `w8a16_rows` reads whole
rows back out of it, so the table is held once.

`w8a16_linear_ref` is the specification (pure torch, any CPU); `w8a16_linear` runs the kernel, the
`torch.ops.structserve_cpu.w8a16_linear` operator of kernels/cpu_ops.py's library.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.cpu_ops import load_common_ops, register_fake
from kernels.w4a8_linear import GROUP, quantize_activations

BLOCK = 16     # weight rows per packed block: one int32 lane of vpdpbusd each
QUAD = 4       # inputs per int32 lane of one vpdpbusd


class W8A16Weight(NamedTuple):
    """A weight in the kernel's layout (`pack_w8a16`); `w8a16_linear(x, *weight)` runs it.

    packed: uint8 `[ceil(N / 16), K * 16]`: per block of 16 rows, K / 4 vectors of 64 bytes (one
        per input quad j, inputs 4j .. 4j + 3): byte 4r + t holds row r's input 4j + t plus 128
        (rows past N hold 128: weight 0).
    scales: bf16 `[ceil(N / 16), 16]`: per block, its 16 rows' (0 past N).
    out_features: N.
    """

    packed: torch.Tensor
    scales: torch.Tensor
    out_features: int


def pack_w8a16(qvals: torch.Tensor, scales: torch.Tensor) -> W8A16Weight:
    """The kernel's layout (`W8A16Weight`) of an int8 weight: `qvals` int8 `[N, K]`, `scales` float
    `[N]` (rounded to bf16 here). Raises ValueError unless qvals is int8 with K a multiple of 32
    and scales is `[N]`."""
    n, k = qvals.shape
    if qvals.dtype != torch.int8:
        raise ValueError(f"W8A16 weights must be int8, got {qvals.dtype}")
    if k % GROUP:
        raise ValueError(f"W8A16 needs in_features divisible by {GROUP}, got {k}")
    if scales.shape != (n,):
        raise ValueError(f"scales must be [{n}], got {tuple(scales.shape)}")
    blocks = -(-n // BLOCK)
    pad = blocks * BLOCK - n
    offset = (qvals.to(torch.int16) + 128).to(torch.uint8)
    offset = torch.nn.functional.pad(offset, (0, 0, 0, pad), value=128)                # [N', K]
    # [blocks, row, quad, t] -> [blocks, quad, row, t]
    packed = offset.reshape(blocks, BLOCK, k // QUAD, QUAD).transpose(1, 2).reshape(blocks, k * BLOCK)
    lines = torch.nn.functional.pad(scales.to(torch.bfloat16), (0, pad)).reshape(blocks, BLOCK)
    return W8A16Weight(packed.contiguous(), lines.contiguous(), n)


def w8a16_rows(packed: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """int8 `[len(rows), K]`: the weight rows `rows` (int64 `[T]`, each < N) read out of a packed
    `[ceil(N / 16), K * 16]` layout (a table lookup over the packed head)."""
    blocks, k = packed.shape[0], packed.shape[1] // BLOCK
    quads = packed.view(blocks, k // QUAD, BLOCK, QUAD)[rows // BLOCK, :, rows % BLOCK, :]   # [T, K / 4, 4]
    return (quads.reshape(rows.shape[0], k).to(torch.int16) - 128).to(torch.int8)


def unpack_w8a16(weight: W8A16Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values `[N, K]`, bf16 scales `[N]`) of a weight `pack_w8a16` packed."""
    packed, scales, n = weight
    return w8a16_rows(packed, torch.arange(n)), scales.reshape(-1)[:n]


def two_level_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q1, s1, q2, s2) of float32 `x` `[M, K]`: q1 float `[M, K // 32, 32]` integers in -127..127
    and s1 `[M, K // 32, 1]` as `quantize_activations(x)`; q2, s2 the same of the float32 residual
    x - q1 * s1."""
    q1, s1 = quantize_activations(x)
    residual = x.float().reshape(q1.shape) - q1 * s1
    q2, s2 = quantize_activations(residual.reshape(x.shape[0], -1))
    return q1, s1, q2, s2


def w8a16_linear_ref(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
    """Reference of `w8a16_linear` in float64 then float32: `x` float32 `[M, K]`, the weight as
    `pack_w8a16` returns it; returns float32 `[M, N]`. It unpacks the layout, so it also checks
    `pack_w8a16`."""
    qvals, row_scales = unpack_w8a16(W8A16Weight(packed, scales, out_features))
    q1, s1, q2, s2 = two_level_activations(x)
    xq = (q1.double() * s1.double() + q2.double() * s2.double()).reshape(x.shape[0], -1)
    return ((xq @ qvals.double().t()) * row_scales.double()).float()


def w8a16_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, out_features: int) -> torch.Tensor:
    """`w8a16_linear_ref` through the C++ kernel: float32 `[M, K]` -> float32 `[M, N]`, run on
    torch's intra-op threads (blocks of 16 weight rows split between them). Raises
    CpuOpsUnavailable where the kernel cannot be loaded, RuntimeError for shapes or dtypes that do
    not match the layout."""
    load_common_ops()
    return torch.ops.structserve_cpu.w8a16_linear(x, packed, scales, out_features)


def _register_fake() -> None:
    """Shapes for torch.compile's tracing: `[M, K]` -> `[M, out_features]` float32."""
    @torch.library.register_fake("structserve_cpu::w8a16_linear")
    def _(x, packed, scales, out_features):
        return x.new_empty((x.shape[0], out_features))


register_fake(_register_fake)

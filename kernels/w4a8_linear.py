"""W4A8 projection for a few rows on AVX512-VNNI CPUs: 4-bit weight groups times int8 activations.

`y = x @ W.T` with W `[N, K]` held as 4-bit values q in 0..15 per group of 32 inputs with a bf16
scale and zero each (w = (q - 8) * scale + zero, engine/models/quantized_tensor.py's convention),
and x `[M, K]` float32 quantized per group of 32 to int8 (step = max |x| / 127, round to nearest)
inside the call. Per group: scale * step * sum((q - 8) * qx) + zero * sum(x), the second term
with the exact float sum of x. This is llama.cpp's Q4_1 x Q8_1 dot-product scheme (ggml-quants.c);
the C++ kernel (kernels/cpu/w4a8.cpp) runs it with vpdpbusd and is ours.

Why: torch's weight-only int4 kernel (`_weight_int4pack_mm_for_cpu`) dequantizes to bf16 and is
compute-bound at one row; integer dot products over the packed nibbles read the same bytes with
fewer instructions (shared/research/cpu-performance.md §3).

Measured on the project's Intel AVX-512 (VNNI, bf16, AMX) box, 2 threads, one row: 1.7-2.6x
faster than tinygemm per projection with the weights in cache; SmolLM2's 120 layer projections in
model order (weights streamed from memory) 3.6 against 4.6 ms a pass.

`w4a8_linear_ref` is the specification (pure torch, any CPU); `w4a8_linear` runs the kernel, the
`torch.ops.structserve_cpu.w4a8_linear` operator of kernels/cpu_ops.py's library (AVX512-VNNI).
"""

from __future__ import annotations

import torch

from kernels.cpu_ops import load_cpu_ops, register_fake

GROUP = 32


def pack_w4a8(qvals: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's layout of a 4-bit weight: (packed uint8 `[N, K / 2]`, scales bf16 `[N, K / 32]`,
    zeros bf16 `[N, K / 32]`). `qvals` `[N, K]` integers in 0..15, `scales` / `zeros` `[N, K / 32]`
    float (rounded to bf16 here). Per row, each quad of groups (128 inputs) is 64 bytes whose low
    nibbles hold its first pair of groups in `lane_order` and whose high nibbles the second; where
    K is not a multiple of 128 the last pair is 32 bytes, byte j holding `lane_order` positions 2j
    (low nibble) and 2j + 1 (high). Raises ValueError unless K is a multiple of
    64 and the values fit 4 bits."""
    n, k = qvals.shape
    if k % (2 * GROUP):
        raise ValueError(f"W4A8 needs in_features divisible by 64, got {k}")
    if qvals.numel() and (int(qvals.min()) < 0 or int(qvals.max()) > 15):
        raise ValueError("W4A8 weights must be 4-bit values in 0..15")
    if scales.shape != (n, k // GROUP) or zeros.shape != scales.shape:
        raise ValueError(f"scales and zeros must be [{n}, {k // GROUP}], got {tuple(scales.shape)}, "
                         f"{tuple(zeros.shape)}")
    ordered = qvals.to(torch.uint8).reshape(n, k // 64, 64)[:, :, lane_order()]   # [N, pairs, 64]
    quads = k // 128
    parts = []
    if quads:   # 64 bytes per quad: low nibbles the first pair, high nibbles the second
        pairs = ordered[:, :2 * quads].reshape(n, quads, 2, 64)
        parts.append((pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(n, quads * 64))
    if k % 128:  # a last pair of 32 bytes: byte j holds lane positions 2j (low) and 2j + 1 (high)
        last = ordered[:, -1]
        parts.append(last[:, 0::2] | (last[:, 1::2] << 4))
    return (torch.cat(parts, dim=1).contiguous(), scales.to(torch.bfloat16).contiguous(),
            zeros.to(torch.bfloat16).contiguous())


def unpack_w4a8(packed: torch.Tensor) -> torch.Tensor:
    """The 4-bit values (uint8 `[N, K]`, 0..15, input order) of a weight `pack_w4a8` packed."""
    n, k = packed.shape[0], packed.shape[1] * 2
    quads = k // 128
    pairs = []
    if quads:
        body = packed[:, :quads * 64].reshape(n, quads, 64)
        pairs.append(torch.stack([body & 0x0F, body >> 4], dim=2).reshape(n, 2 * quads, 64))
    if k % 128:
        last = packed[:, quads * 64:]
        pairs.append(torch.stack([last & 0x0F, last >> 4], dim=-1).reshape(n, 1, 64))
    ordered = torch.cat(pairs, dim=1)
    qvals = torch.empty_like(ordered)
    qvals[:, :, lane_order()] = ordered
    return qvals.reshape(n, k)


def lane_order() -> torch.Tensor:
    """int64 `[64]`: for each unpacked byte position of a pair of groups, the input index (0..63,
    group 0 then group 1) it holds. Lane l of vpdpbusd (bytes 4l..4l+3) holds group l % 2, elements
    4 * (l // 2) .. + 3, so that one instruction sums both groups, 8 lanes each."""
    lanes = torch.arange(16)
    group, first = lanes % 2, 4 * (lanes // 2)
    return (group[:, None] * GROUP + first[:, None] + torch.arange(4)).reshape(64)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(qx float `[M, K // 32, 32]` with integer values in -127..127, step float `[M, K // 32, 1]`)
    of float32 `x` `[M, K]`: per group of 32, step = max |x| / 127, qx = round-half-even(x / step)
    (0 where the group is all zeros)."""
    groups = x.float().reshape(x.shape[0], -1, GROUP)
    step = groups.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(step > 0, 1 / step, torch.zeros_like(step))
    return torch.round(groups * inverse), step


def w4a8_linear_ref(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
                    ) -> torch.Tensor:
    """Reference of `w4a8_linear` in float64 then float32: `x` float32 `[M, K]`, weights as
    `pack_w4a8` returns them; returns float32 `[M, N]`. It unpacks the layout, so it also checks
    `pack_w4a8`."""
    n, k = packed.shape[0], packed.shape[1] * 2
    q = unpack_w4a8(packed).reshape(n, k // GROUP, GROUP).double() - 8     # [N, G, 32]
    qx, step = quantize_activations(x)                                        # [M, G, 32], [M, G, 1]
    integer = torch.einsum("ngi,mgi->mng", q, qx.double())                    # [M, N, G]
    scaled = integer * scales.double()[None] * step.double().squeeze(-1)[:, None, :]
    group_sum = x.double().reshape(x.shape[0], -1, GROUP).sum(-1)             # [M, G]
    return (scaled.sum(-1) + group_sum @ zeros.double().t()).float()


def w4a8_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor
                ) -> torch.Tensor:
    """`w4a8_linear_ref` through the C++ kernel: float32 `[M, K]` -> float32 `[M, N]`, run on
    torch's intra-op threads. Raises CpuOpsUnavailable where the kernel cannot be loaded."""
    load_cpu_ops()
    return torch.ops.structserve_cpu.w4a8_linear(x, packed, scales, zeros)


def _register_fake() -> None:
    """Shapes for torch.compile's tracing: `[M, K]` x `[N, K / 2]` -> `[M, N]` float32."""
    @torch.library.register_fake("structserve_cpu::w4a8_linear")
    def _(x, packed, scales, zeros):
        return x.new_empty((x.shape[0], packed.shape[0]))


register_fake(_register_fake)

"""INT8 weight-only projection for a few rows on AVX-512 CPUs: int8 rows times float32 activations.

`y = (x @ W.T) * scale` with W `[N, K]` int8 per output channel and a bf16 scale per row
(engine/models/quantized_tensor.py's `Int8Channels`, the row-major layout of torch's
`_weight_int8pack_mm`, so a tied embedding keeps sharing the bytes) and x `[M, K]` float32. The
C++ kernel (kernels/cpu/int8_linear.cpp) widens each weight row to float32 16 values at a time and
sums in float32; x is not rounded (torch's kernel takes bf16 activations).

Why: a row's result independent of its batch and of bf16 rounding of the activations, at least
torch's speed. Measured on the project's 2-core AVX-512 box (quiet, one sitting), SmolLM2's int8
LM head (49152 x 576, 27 MiB): 1.29 against 1.39 ms at one row, 1.27 against 1.40 at two, equal
at 4 and 8 rows (2.0 and 4.1 ms); about 22 GB/s, so still bound by the widening, not the reads.

`int8_linear_ref` is the specification (pure torch, any CPU); `int8_linear` runs the kernel, the
`torch.ops.structserve_cpu.int8_linear` operator of kernels/cpu_ops.py's library.
"""

from __future__ import annotations

import torch

from kernels.cpu_ops import load_cpu_ops, register_fake


def int8_linear_ref(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Reference of `int8_linear` in float64 then float32: `x` float32 `[M, K]`, `weight` int8
    `[N, K]`, `scales` bf16 `[N]`; returns float32 `[M, N]`."""
    return ((x.double() @ weight.double().t()) * scales.double()).float()


def int8_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`int8_linear_ref` through the C++ kernel: float32 `[M, K]` -> float32 `[M, N]`, weight rows
    split between torch's intra-op threads. Raises CpuOpsUnavailable where the kernel cannot be
    loaded, RuntimeError for shapes or dtypes other than the reference's."""
    load_cpu_ops()
    return torch.ops.structserve_cpu.int8_linear(x, weight, scales)


def _register_fake() -> None:
    """Shapes for torch.compile's tracing: `[M, K]` x `[N, K]` -> `[M, N]` float32."""
    @torch.library.register_fake("structserve_cpu::int8_linear")
    def _(x, weight, scales):
        return x.new_empty((x.shape[0], weight.shape[0]))


register_fake(_register_fake)

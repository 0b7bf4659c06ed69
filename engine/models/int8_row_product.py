"""One row times an int8 weight, written as a reduction for inductor to fuse: the compiled
one-sequence decode's LM head.

Why: torch's `_weight_int8pack_mm` streams SmolLM2's tied 49152 x 576 head (28 MB of int8) at
about 7 GB/s on one thread of this project's AVX-512 box (3.8-4.2 ms per token). Written as
`(x * q).sum(-1) * scale`, inductor emits one vectorised C++ loop over the weight's rows that
converts int8 to float32 in registers and accumulates in float32: 2.65 against 3.82 ms alone.
Inside the whole decode graph inductor also inlines the producer of `x` (the final RMSNorm) into
that loop and recomputes it for every one of the 49152 rows (4.9 ms, slower than the kernel), so
`x` first goes through `structserve::materialize`, an operator inductor cannot see into: its
output is a buffer the loop only reads (3.8 against 5.3 ms for the kernel on the same, busy box).
Only under torch.compile (run eagerly, the expression would build a float32 copy of the weight),
only for one row (the loop reads the weight once per row: at 2 rows as slow as the kernel, at
4 rows 1.7x slower), and only where torch's CPU capability is AVX-512 (`row_loop_is_faster`): on
an AVX2-only AMD EPYC the same loop over 16-lane int8 vectors took 17.2 ms per token on one
thread against the kernel's 9.3 ms, a third of the one-sequence step. Importing this module
registers the operator (once per process).
"""

from __future__ import annotations

import torch


@torch.library.custom_op("structserve::materialize", mutates_args=())
def _materialize_op(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@_materialize_op.register_fake
def _materialize_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


# Read once: a plain bool that torch.compile reads as a constant while tracing.
_ROW_LOOP_FASTER = torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def row_loop_is_faster() -> bool:
    """True where `int8_row_product`'s inductor loop beats `_weight_int8pack_mm` for one row: CPUs
    whose torch capability is AVX-512 (measured 2.65 against 3.82 ms on the project's AVX-512
    box); False on AVX2 or less (17.2 against 9.3 ms on an AVX2-only EPYC, one thread)."""
    return _ROW_LOOP_FASTER


def int8_row_product(x: torch.Tensor, qvals: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`x @ (qvals * scales[:, None]).T` for one row, under torch.compile.

    `x` bf16 `[1, in]`, `qvals` int8 `[out, in]`, `scales` bf16 `[out]` -> float32 `[1, out]`,
    accumulated in float32. `_weight_int8pack_mm` returns bf16, so the eager step's logits are
    rounded to bf16 (up to 2**-7 relative, one unit of its last place) where these are not.
    Raises ValueError for more than one row (see the module docstring for why).
    """
    if x.shape[0] != 1:
        raise ValueError(f"int8_row_product takes one row, got {tuple(x.shape)}")
    x = torch.ops.structserve.materialize(x)
    return ((x.float() * qvals.float()).sum(-1) * scales.float()).unsqueeze(0)

"""The formats a projection's weight can be held in, and which ones this machine runs well.

Measured on the project's 2-core AVX-512 (bf16, VNNI) box (shared/research/cpu-performance.md §3):
weight-only int4/int8 kernels (`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`, bf16
activations) read 4-8x fewer bytes and win at one row, but re-dequantize per 4-row block and lose
2-3x to oneDNN bf16 from ~8 rows; oneDNN bf16 is ~1.7x faster than float32 there. On CPUs without
native bf16 (AVX2 only, or AVX-512 without avx512_bf16/AMX) oneDNN emulates bf16 and float32 is
the fast large-batch format.
"""

from __future__ import annotations

import enum
from pathlib import Path

import torch

CPUINFO_PATH = Path("/proc/cpuinfo")
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


class WeightFormat(enum.Enum):
    """How one copy of a projection weight is stored and multiplied.

    INT4: packed 4-bit, group 32, bf16 scale/zero (`_weight_int4pack_mm_for_cpu`), CPU only.
    INT8: int8 per output channel, bf16 scales (`_weight_int8pack_mm`), CPU only.
    BF16: oneDNN-reordered bfloat16 (`mkldnn._linear_pointwise`), CPU only.
    FP32: oneDNN-reordered float32 (`mkldnn._linear_pointwise`), CPU only; the parity reference.
    DENSE: a plain tensor in the model dtype through `F.linear` (CUDA, or CPUs without oneDNN).
    """

    INT4 = "int4"
    INT8 = "int8"
    BF16 = "bf16"
    FP32 = "fp32"
    DENSE = "dense"

    @property
    def is_quantized(self) -> bool:
        """True for the weight-only integer formats (fast at few rows only)."""
        return self in (WeightFormat.INT4, WeightFormat.INT8)


def cpu_flags(cpuinfo: Path = CPUINFO_PATH) -> frozenset[str]:
    """The first processor's feature flags from /proc/cpuinfo; empty where the file is absent."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_has_native_bf16(flags: frozenset[str] | None = None) -> bool:
    """True when the CPU multiplies bf16 in hardware (avx512_bf16 or AMX); oneDNN emulates it
    elsewhere, several times slower than float32."""
    return bool((cpu_flags() if flags is None else flags) & NATIVE_BF16_FLAGS)


def onednn_bf16_supported() -> bool:
    """True when oneDNN can reorder and multiply bf16 weights on this CPU at all (avx512bw/vl/dq or
    avx_ne_convert; emulated without avx512_bf16). On AVX2-only CPUs its bf16 linear refuses to run."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def large_batch_format(device: torch.device, dtype: torch.dtype, quantized: bool, native_bf16: bool) -> WeightFormat:
    """The format of the copy that serves many rows (prefill, big decode batches).

    Off CPU or without oneDNN: DENSE. On CPU: BF16 when the CPU has native bf16 and either the
    weights are quantized (their values are already off the float grid, measured top-1 100 % vs
    float32) or the model dtype is bfloat16; FP32 for a float32 model otherwise (the reference);
    DENSE for a bf16/fp16 model on a CPU without native bf16.
    """
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return WeightFormat.DENSE
    if native_bf16 and (quantized or dtype == torch.bfloat16):
        return WeightFormat.BF16
    if dtype == torch.float32:
        return WeightFormat.FP32
    return WeightFormat.DENSE

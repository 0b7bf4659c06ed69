"""Which formats each projection is held in: from `--quantization`, the checkpoint's own tensor
types, the device and dtype, the CPU's features, and a crossover measured at load."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

import torch

from engine.config import ALL_ROWS, DEFAULT_INT4_KERNEL, INT4_KERNEL_CHOICES
from engine.errors import ModelLoadError
from engine.models.crossover import measure_crossovers
from engine.models.quantized_linear import QuantizedLinear
from engine.models.quantized_tensor import GROUP_SIZE, Int4Groups, Int8Channels, SourceWeight, cat_rows, dequantize
from engine.models.weight_format import WeightFormat, cpu_has_native_bf16, large_batch_format
from kernels.cpu_ops import CpuOpsUnavailable, cpu_supports_common_ops, load_common_ops

logger = logging.getLogger(__name__)

QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4")
Role = Literal["layer", "head"]


# A measured crossover never drops the decoder layers' int4/int8 copies below 2 rows: a busy machine
# at load time makes the small copies' OpenMP regions stall and can time them 20x slower than on a
# quiet one (seen: 448 ms vs 24 ms per pass, where a quiet box measured 4.9 vs 12.9 ms), and the
# compiled decode step pads a lone sequence to 2 rows, so a floor of 2 keeps c=1 on the copies
# that stream 4x fewer bytes. The LM head's int8 copy has no floor (bf16 matches it at 1-2 rows).
MIN_MEASURED_CROSSOVER = {"layer": 2}


@dataclass(frozen=True, slots=True)
class WeightSummary:
    """What the loaded model holds: per role ("layer" = the decoder projections, "head" = the LM
    head, "embedding" = the lookup's own bytes), the formats, the resident bytes per copy
    (`{"int4": ..., "bf16": ...}`) and the crossover (largest row count served by the int4/int8
    copy; 0 = none held; ALL_ROWS = every row count, no bf16/float32 copy held).
    `cpu_capability` and `native_bf16` record what the choice was based on."""

    quantization: str
    cpu_capability: str
    native_bf16: bool
    formats: dict[str, str]
    resident_bytes: dict[str, dict[str, int]]
    crossover_rows: dict[str, int]

    def describe(self) -> str:
        """One log line: formats, crossovers and MiB per copy."""
        mib = {name: {fmt: round(size / 2**20, 1) for fmt, size in copies.items()}
               for name, copies in self.resident_bytes.items()}
        crossovers = {name: "all" if rows >= ALL_ROWS else rows for name, rows in self.crossover_rows.items()}
        return (f"quantization {self.quantization}, CPU {self.cpu_capability} (native bf16: {self.native_bf16}), "
                f"formats {self.formats}, crossover rows {crossovers}, resident MiB {mib} "
                f"({self.total_bytes() / 2**20:.1f} in all)")

    def total_bytes(self) -> int:
        """Bytes of every copy of every weight together."""
        return sum(sum(copies.values()) for copies in self.resident_bytes.values())


@dataclass(slots=True)
class WeightBuilder:
    """Builds the QuantizedLinear of each projection as its parts arrive during a load, then
    (`finish`) sets the crossover of every projection and summarises what is held.

    quantization: "auto" (a GGUF keeps its own precision: Q4_0/Q4_1 layers as INT4 on the file's
    grid, Q8_0 as INT8 per channel, float tensors as float; a float checkpoint stays float),
    "none" (everything dequantized to `dtype`: the float32 parity reference), "int8" (INT8 per
    channel everywhere), "int4" (INT4 group 32 for the layers, INT8 for the LM head, whose Q8_0
    values int4 would coarsen: top-1 85-88 % in the research note). Quantized formats need a CPU.
    crossover_rows: rows served by the int4/int8 copies, the same for every projection; None =
    measured at load over the loaded projections (engine/models/crossover.py).
    int4_kernel: the INT4 copies' kernel: "w4a8" (kernels/w4a8_linear.py, int8 activations,
    AVX512-VNNI or AVX2), "tinygemm" (torch's `_weight_int4pack_mm_for_cpu`, bf16 activations) or
    "auto": w4a8 where the CPU has AVX512-VNNI or AVX2 and FMA and the kernel builds, tinygemm
    elsewhere (the choice is logged).
    int8_kernel (not an argument): the INT8 copies' kernel, "w8a16" (kernels/w8a16_linear.py) where
    the C++ library loads, else "int8pack" (`resolve_int8_kernel`).
    """

    quantization: str
    dtype: torch.dtype
    device: torch.device
    crossover_rows: int | None = None
    int4_kernel: str = DEFAULT_INT4_KERNEL
    native_bf16: bool = field(default_factory=cpu_has_native_bf16)
    int8_kernel: str = field(default="int8pack", init=False)

    def __post_init__(self) -> None:
        if self.quantization not in QUANTIZATION_CHOICES:
            raise ModelLoadError(f"unknown quantization {self.quantization!r}; "
                                 f"choose from {', '.join(QUANTIZATION_CHOICES)}")
        if self.quantization in ("int8", "int4") and self.device.type != "cpu":
            raise ModelLoadError(f"--quantization {self.quantization} runs on CPU only (device {self.device}); "
                                 "use --quantization none")
        if self.crossover_rows is not None and self.crossover_rows < 0:
            raise ModelLoadError(f"crossover_rows must be >= 0, got {self.crossover_rows}")
        if self.int4_kernel not in INT4_KERNEL_CHOICES:
            raise ModelLoadError(f"unknown int4 kernel {self.int4_kernel!r}; choose from {', '.join(INT4_KERNEL_CHOICES)}")
        # resolved only where int4 copies can exist; elsewhere the field is unused
        can_hold_int4 = self.device.type == "cpu" and self.quantization in ("auto", "int4")
        self.int4_kernel = resolve_int4_kernel(self.int4_kernel) if can_hold_int4 else "tinygemm"
        can_hold_int8 = self.device.type == "cpu" and self.quantization != "none"
        self.int8_kernel = resolve_int8_kernel() if can_hold_int8 else "int8pack"

    def small_format(self, parts: list[SourceWeight], role: Role) -> WeightFormat | None:
        """The few-rows format for a projection made of `parts`, or None for a float-only one.
        Raises ModelLoadError for int4 on in_features not divisible by 32."""
        if self.device.type != "cpu" or self.quantization == "none":
            return None
        if self.quantization == "auto":
            if any(isinstance(part, torch.Tensor) for part in parts):
                return None
            if role == "layer" and all(isinstance(part, Int4Groups) for part in parts):
                return WeightFormat.INT4
            return WeightFormat.INT8
        if self.quantization == "int4" and role == "layer":
            if parts[0].shape[1] % GROUP_SIZE:
                raise ModelLoadError(f"--quantization int4 needs in_features divisible by {GROUP_SIZE}, "
                                     f"got {parts[0].shape[1]}; use int8")
            return WeightFormat.INT4
        return WeightFormat.INT8

    def build(self, parts: list[SourceWeight], bias: torch.Tensor | None, role: Role,
              int8: Int8Channels | None = None) -> QuantizedLinear:
        """One projection from its row parts (fused in order) and bias `[out]` or None, holding
        its small copy (if any) until `finish` sets the crossover. `int8`: its INT8 copy, already
        quantized (shared with a tied embedding)."""
        weight = parts[0] if len(parts) == 1 else cat_rows(parts)
        small = self.small_format(parts, role)
        large = large_batch_format(self.device, self.dtype, small is not None, self.native_bf16)
        return QuantizedLinear(weight, bias, small, large, 0, self.dtype, self.device, int8=int8,
                               int4_kernel=self.int4_kernel, int8_kernel=self.int8_kernel)

    def head_rows(self, source: SourceWeight) -> Int8Channels | None:
        """The LM head's / embedding's int8 rows when the head gets an INT8 copy, else None."""
        if self.small_format([source], "head") is None:
            return None
        return Int8Channels.from_float(dequantize(source))

    def finish(self, groups: dict[str, list[QuantizedLinear]]) -> WeightSummary:
        """Set every projection's crossover (`crossover_rows`, or measured per group; 0 drops the
        small copies, ALL_ROWS the large ones) and summarise formats and bytes per group ("layer", "head")."""
        with_small = {name: projs for name, projs in groups.items() if projs and projs[0].small is not None}
        if self.crossover_rows is not None:
            crossovers = {name: self.crossover_rows for name in with_small}
        else:
            measured = measure_crossovers(with_small) if with_small else {}
            crossovers = {name: max(rows, MIN_MEASURED_CROSSOVER.get(name, 0)) for name, rows in measured.items()}
            if crossovers != measured:
                logger.info("crossover rows raised to the floor %s: %s", MIN_MEASURED_CROSSOVER, crossovers)
        formats: dict[str, str] = {}
        resident: dict[str, dict[str, int]] = {}
        for name, projs in groups.items():
            for proj in projs:
                proj.set_crossover(crossovers.get(name, 0))
                for fmt, size in proj.resident_bytes().items():
                    resident.setdefault(name, {})[fmt] = resident.get(name, {}).get(fmt, 0) + size
            small = projs[0].small
            kernels = sorted({proj.small_kernel for proj in projs if proj.small_kernel is not None})
            held = "none" if small is None else small.value + (f" ({', '.join(kernels)})" if kernels else "")
            large = projs[0].large
            formats[name] = held if large is None else f"{held} + {large.value}"
        return WeightSummary(self.quantization, torch.backends.cpu.get_cpu_capability(), self.native_bf16,
                             formats, resident, {name: crossovers.get(name, 0) for name in groups})


def resolve_int4_kernel(requested: str) -> str:
    """"tinygemm" or "w4a8" for `requested` ("auto", "w4a8", "tinygemm"): "auto" is w4a8 where the
    CPU has AVX512-VNNI or AVX2 and FMA and the kernel builds and loads (kernels/w4a8_linear.py;
    ~7 s the first time on a machine, then cached), else tinygemm, logged. Raises ModelLoadError
    when "w4a8" is asked for and cannot run here."""
    if requested == "tinygemm":
        return requested
    if requested == "auto" and not cpu_supports_common_ops():
        logger.info("int4 kernel: tinygemm (this CPU lacks AVX512-VNNI and AVX2 for the w4a8 kernel)")
        return "tinygemm"
    try:
        library = load_common_ops()
    except (CpuOpsUnavailable, OSError, RuntimeError) as error:
        if requested == "w4a8":
            raise ModelLoadError(f"--int4-kernel w4a8 cannot run here: {error}") from error
        logger.warning("int4 kernel: tinygemm (the w4a8 kernel is unavailable: %s)", error)
        return "tinygemm"
    how = "AVX512-VNNI" if library == "avx512" else "AVX2"
    logger.info("int4 kernel: w4a8 (%s, int8 activations per group of 32)", how)
    return "w4a8"


def resolve_int8_kernel() -> str:
    """The int8 copies' kernel: "w8a16" (kernels/w8a16_linear.py: activations as two int8 levels
    per group of 32, integer dot products) where one of kernels/cpu_ops.py's libraries loads on
    this CPU (AVX512-VNNI, or AVX2 and FMA), else "int8pack" (torch's `_weight_int8pack_mm`, bf16
    activations); a failed build is logged."""
    if not cpu_supports_common_ops():
        return "int8pack"
    try:
        load_common_ops()
    except (CpuOpsUnavailable, OSError, RuntimeError) as error:
        logger.warning("int8 kernel: int8pack (the w8a16 kernel is unavailable: %s)", error)
        return "int8pack"
    return "w8a16"

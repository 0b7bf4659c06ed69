"""One projection `y = x @ W.T + b`, its weight held in at most two formats, the copy picked per call
by the number of rows.

Why two copies: weight-only int4/int8 kernels stream 4-8x fewer bytes and win for a decode step
of a few sequences, while oneDNN's bf16 (or float32) product over a weight reordered once at load
wins from a handful of rows on (shared/research/cpu-performance.md §3), and the int4 kernel that
quantizes its activations to int8 (w4a8, VNNI) can win at every row count (then only the small copy
is held: ALL_ROWS). `crossover_rows` is chosen by measurement at load (engine/models/crossover.py).
No dense float copy is kept beside them.

Activations stay in the model dtype (float32 on CPU) and are cast to bf16 only at the inputs of
the int4/int8/bf16 kernels, whose fast paths exist only for bf16 (30-60x slower with float32);
outputs come back in the model dtype, the bias added there.

For torch.compile: `forward` uses only torch ops and branches only on `x.shape[0]` against the
constant `crossover_rows`; the oneDNN-reordered copies go through one operator of our own
(engine/models/onednn_linear.py), so every weight can be a plain graph input (no freezing) and
the compiled graph can be cached on disk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import ALL_ROWS
from engine.models.onednn_linear import onednn_linear
from kernels.cpu_ops import load_common_ops
from kernels.w4a8_linear import pack_w4a8
from kernels.w8a16_linear import pack_w8a16
from engine.models.quantized_tensor import GROUP_SIZE, Int4Groups, Int8Channels, SourceWeight, dequantize
from engine.models.weight_format import WeightFormat, onednn_bf16_supported

PACK_BATCH_HINT = 32    # rows oneDNN's reorder is tuned for; any row count works with the copy
INT4_KERNELS = ("tinygemm", "w4a8")
INT8_KERNELS = ("int8pack", "w8a16")
_SMALL_COPY_BUFFERS = ("int4_weight", "int4_scales_zeros", "w4a8_weight", "w4a8_scales", "w4a8_zeros",
                       "int8_weight", "int8_scales", "w8a16_weight", "w8a16_scales")
_INT4_ROW_MULTIPLE = 16  # `_convert_weight_to_int4pack_for_cpu` needs out_features divisible by 16


class QuantizedLinear(nn.Module):
    """A projection `[in_features] -> [out_features]` with a few-rows copy (`small`: INT4 or INT8,
    or None) used for inputs of at most `crossover_rows` rows, and a many-rows copy (`large`: BF16,
    FP32 or DENSE) for the rest; `set_crossover` drops the small copy (0 rows) or the large one
    (ALL_ROWS: `large` is then None).

    `weight` `[out, in]` is the source (float tensor, or quantized groups kept exactly: INT4 from
    Int4Groups keeps the file's grid; other sources are quantized here, INT4 asymmetric group 32,
    INT8 symmetric per channel). With a small copy, the large copy holds the very values the small
    copy's kernel multiplies by (its bf16 scales and zeros applied), rounded to bf16 for BF16, so
    every row count runs the same weights. `bias` `[out]` or None is kept in `dtype`. `device`
    holds the copies; INT4/INT8/BF16/FP32 need a CPU. `int8`: the INT8 copy already quantized from
    `weight` (its qvals tensor is then shared, e.g. with a tied embedding). `int4_kernel` picks the
    INT4 copy's kernel and layout: "tinygemm" (torch's `_weight_int4pack_mm_for_cpu`, activations
    rounded to bf16) or "w4a8" (kernels/w4a8_linear.py: activations quantized to int8 per group of
    32, AVX512-VNNI or AVX2). `int8_kernel` picks the INT8 copy's: "int8pack" (torch's
    `_weight_int8pack_mm`, row-major, activations rounded to bf16) or "w8a16"
    (kernels/w8a16_linear.py: activations as two int8 levels per group of 32, AVX512-VNNI or AVX2; a
    projection whose in_features is not a multiple of 32 keeps int8pack). Raises ValueError for
    INT4 with in_features not a multiple of 32, for an unknown `int4_kernel` or `int8_kernel`, for
    a format off CPU, for a quantized `large`, or for BF16 on a CPU whose oneDNN has no bf16
    linear (`onednn_bf16_supported`: AVX2-only CPUs).
    """

    def __init__(self, weight: SourceWeight, bias: torch.Tensor | None, small: WeightFormat | None,
                 large: WeightFormat, crossover_rows: int, dtype: torch.dtype, device: torch.device,
                 int8: Int8Channels | None = None, int4_kernel: str = "tinygemm",
                 int8_kernel: str = "int8pack") -> None:
        super().__init__()
        if int4_kernel not in INT4_KERNELS:
            raise ValueError(f"int4_kernel must be one of {INT4_KERNELS}, got {int4_kernel!r}")
        if int8_kernel not in INT8_KERNELS:
            raise ValueError(f"int8_kernel must be one of {INT8_KERNELS}, got {int8_kernel!r}")
        if large.is_quantized or (small is not None and not small.is_quantized):
            raise ValueError(f"small copy must be int4/int8 and large copy float, got {small} / {large}")
        if device.type != "cpu" and (small is not None or large is not WeightFormat.DENSE):
            raise ValueError(f"weight formats other than dense run on CPU only (device {device})")
        if large is WeightFormat.BF16 and not onednn_bf16_supported():
            raise ValueError("the bf16 copy needs oneDNN's bf16 linear, which this CPU lacks (it needs "
                             "avx512bw/vl/dq or avx_ne_convert); hold the large copy in fp32")
        self.out_features, self.in_features = int(weight.shape[0]), int(weight.shape[1])
        self.small, self.large = small, large
        self.int4_kernel = int4_kernel if small is WeightFormat.INT4 else None
        if int8_kernel == "w8a16" and self.in_features % GROUP_SIZE:
            int8_kernel = "int8pack"
        self.int8_kernel = int8_kernel if small is WeightFormat.INT8 else None
        self.crossover_rows = crossover_rows if small is not None else 0
        groups: Int4Groups | None = None
        if small is WeightFormat.INT4:
            groups = weight if isinstance(weight, Int4Groups) else Int4Groups.from_float(dequantize(weight))
        if small is WeightFormat.INT8 and int8 is None:
            int8 = Int8Channels.from_float(dequantize(weight))
        elif small is not WeightFormat.INT8:
            int8 = None
        int4 = (None, None) if groups is None or int4_kernel == "w4a8" else _pack_int4(groups)
        w4a8 = (None, None, None) if groups is None or int4_kernel != "w4a8" else _pack_w4a8(groups)
        # the large copy holds the small copy's values, so that a request's results do not depend
        # on how many rows its step had (only the kernels' rounding differs)
        if groups is not None:
            held = Int4Groups(groups.qvals, _bf16(groups.scales), _bf16(groups.zeros)).dequantize()
        elif int8 is not None:
            held = Int8Channels(int8.qvals, _bf16(int8.scales)).dequantize()
        else:
            held = dequantize(weight)
        # buffers, not parameters (no trainable weights here); None where the format is absent
        self.register_buffer("bias", None if bias is None else bias.detach().to(device=device, dtype=dtype),
                             persistent=False)
        self.register_buffer("int4_weight", int4[0], persistent=False)         # uint8 [out padded to 16, in // 2]
        self.register_buffer("int4_scales_zeros", int4[1], persistent=False)   # bf16 [in // 32, out padded, 2]
        self.register_buffer("w4a8_weight", w4a8[0], persistent=False)     # uint8 [ceil(out / 16), in * 8]
        self.register_buffer("w4a8_scales", w4a8[1], persistent=False)     # bf16 [ceil(out / 16), in // 32, 16]
        self.register_buffer("w4a8_zeros", w4a8[2], persistent=False)      # bf16, as the scales
        int8pack = int8 if self.int8_kernel == "int8pack" else None
        w8a16 = (None, None) if int8 is None or self.int8_kernel != "w8a16" else _pack_w8a16(int8)
        self.register_buffer("int8_weight", None if int8pack is None else int8pack.qvals, persistent=False)  # int8 [out, in]
        self.register_buffer("int8_scales", None if int8pack is None else int8pack.scales.to(torch.bfloat16),
                             persistent=False)                                   # bf16 [out]
        self.register_buffer("w8a16_weight", w8a16[0], persistent=False)    # uint8 [ceil(out / 16), in * 16]
        self.register_buffer("w8a16_scales", w8a16[1], persistent=False)    # bf16 [ceil(out / 16), 16]
        self.register_buffer("large_weight", _large_copy(held, large, dtype, device), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`x` `[num_tokens, in_features]` -> `[num_tokens, out_features]` in x's dtype."""
        # without a large copy there is no branch (nothing for torch.compile to guard on)
        small = self.large_weight is None or x.shape[0] <= self.crossover_rows
        y = self.small_product(x) if small else self.large_product(x)
        return y if self.bias is None else y.add_(self.bias)

    def small_product(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T` through the INT4/INT8 copy, in x's dtype (no bias); x cast to bf16 for the
        tinygemm and int8pack kernels, quantized per group inside the w4a8 and w8a16 kernels."""
        # our kernels through their operators (loaded when the copy was packed), not kernels'
        # Python wrappers, whose load check would break torch.compile's graph
        if self.w4a8_weight is not None:
            y = torch.ops.structserve_cpu.w4a8_linear(x.float(), self.w4a8_weight, self.w4a8_scales, self.w4a8_zeros,
                                                      self.out_features)
            return y.to(x.dtype)
        if self.w8a16_weight is not None:
            y = torch.ops.structserve_cpu.w8a16_linear(x.float(), self.w8a16_weight, self.w8a16_scales,
                                                       self.out_features)
            return y.to(x.dtype)
        xb = x.to(torch.bfloat16)
        if self.int4_weight is not None:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.int4_weight, GROUP_SIZE, self.int4_scales_zeros)
            if y.shape[1] != self.out_features:   # rows padded for the packing
                y = y[:, :self.out_features].contiguous()
        elif self.int8_weight is not None:
            y = torch.ops.aten._weight_int8pack_mm(xb, self.int8_weight, self.int8_scales)
        else:
            raise RuntimeError("this projection holds no int4/int8 copy")
        return y.to(x.dtype)

    def large_product(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T` through the BF16/FP32/DENSE copy, in x's dtype (no bias). Raises RuntimeError
        when the large copy was dropped (`set_crossover(ALL_ROWS)`)."""
        if self.large is None:
            raise RuntimeError("this projection holds no bf16/float32 copy (its small copy serves every row count)")
        if self.large is WeightFormat.DENSE:
            return F.linear(x, self.large_weight)
        target = torch.bfloat16 if self.large is WeightFormat.BF16 else torch.float32
        return onednn_linear(x.to(target), self.large_weight, self.out_features).to(x.dtype)

    def set_crossover(self, rows: int) -> None:
        """Serve inputs of at most `rows` rows (>= 0) with the small copy; 0 drops the small copy
        and ALL_ROWS (or more) the large one (its memory is freed either way; a projection without
        a small copy keeps its large one). Called once at load, after measuring
        (engine/models/crossover.py)."""
        self.crossover_rows = rows if self.small is not None else 0
        if self.crossover_rows >= ALL_ROWS:
            self.crossover_rows = ALL_ROWS
            self.large = None
            self.large_weight = None
        if self.crossover_rows == 0:
            self.small = None
            self.int4_kernel = self.int8_kernel = None
            for name in _SMALL_COPY_BUFFERS:
                setattr(self, name, None)

    def resident_bytes(self) -> dict[str, int]:
        """Bytes held per copy, by format name ("int4", "bf16", ...), bias in the large copy's entry
        (the small copy's without a large one). oneDNN-reordered copies count their logical size
        (the blocked layout may pad a little)."""
        sizes: dict[str, int] = {}
        if self.small is not None:
            tensors = [getattr(self, name) for name in _SMALL_COPY_BUFFERS]
            sizes[self.small.value] = sum(t.numel() * t.element_size() for t in tensors if t is not None)
        if self.large is not None:
            sizes[self.large.value] = self.large_weight.numel() * self.large_weight.element_size()
        if self.bias is not None:
            owner = self.large.value if self.large is not None else self.small.value
            sizes[owner] += self.bias.numel() * self.bias.element_size()
        return sizes

    @property
    def small_kernel(self) -> str | None:
        """The small copy's kernel ("tinygemm", "w4a8", "int8pack", "w8a16"), None without one."""
        return self.int4_kernel or self.int8_kernel

    def extra_repr(self) -> str:
        small = "none" if self.small is None else self.small.value
        if self.small_kernel is not None:
            small += f" ({self.small_kernel})"
        rows = "all rows" if self.large is None else f"rows <= {self.crossover_rows}"
        large = "none" if self.large is None else self.large.value
        return (f"in={self.in_features}, out={self.out_features}, small={small} ({rows}), large={large}, "
                f"bias={self.bias is not None}")


def _pack_w4a8(groups: Int4Groups) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed, scales, zeros): the w4a8 kernel's layout of the 4-bit weight (kernels/w4a8_linear.py
    `pack_w4a8`), the kernel loaded. Raises CpuOpsUnavailable where the kernel cannot run."""
    load_common_ops()
    packed, scales, zeros, _ = pack_w4a8(groups.qvals, groups.scales, groups.zeros)
    return packed, scales, zeros


def _pack_w8a16(int8: Int8Channels) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed, scales): the w8a16 kernel's layout of the int8 weight (kernels/w8a16_linear.py
    `pack_w8a16`), the kernel loaded. Raises CpuOpsUnavailable where the kernel cannot run."""
    load_common_ops()
    packed, scales, _ = pack_w8a16(int8.qvals, int8.scales)
    return packed, scales


def _bf16(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to bf16, as the int4/int8 kernels store their scales and zeros."""
    return t.to(torch.bfloat16).float()


def _pack_int4(groups: Int4Groups) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 `[out_pad, in // 2]`, bf16 scales and zeros `[in // 32, out_pad, 2]`) of the
    4-bit weight; rows padded to a multiple of 16 with zero weights."""
    pad = -groups.shape[0] % _INT4_ROW_MULTIPLE
    qvals, scales, zeros = groups.qvals, groups.scales, groups.zeros
    if pad:
        qvals = F.pad(qvals, (0, 0, 0, pad), value=8)   # (8 - 8) * scale + 0 = 0
        scales, zeros = F.pad(scales, (0, 0, 0, pad)), F.pad(zeros, (0, 0, 0, pad))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(qvals.to(torch.int32).contiguous(), 1)
    scales_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16).contiguous()
    return packed, scales_zeros


def _large_copy(weight: torch.Tensor, large: WeightFormat, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The many-rows copy of the float weight `[out, in]`: oneDNN-reordered bf16/float32, or dense."""
    if large is WeightFormat.DENSE:
        return weight.detach().to(device=device, dtype=dtype).contiguous()
    target = torch.bfloat16 if large is WeightFormat.BF16 else torch.float32
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(target).contiguous(), PACK_BATCH_HINT)

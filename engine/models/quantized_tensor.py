"""Quantized weights in their logical form, before packing: what a checkpoint holds, row by row.

A weight `[out_features, in_features]` arrives as a float tensor (safetensors, GGUF F32/F16/BF16)
or as quantized groups along `in_features` (GGUF Q4_0/Q4_1/Q8_0, or a float weight quantized at
load). These classes keep the values exactly as the source defines them, so rows of several
projections can be fused (q/k/v, gate/up) and permuted before `engine/models/quantized_linear.py`
packs them for the CPU kernels. The 4-bit convention is the one of torch's
`_weight_int4pack_mm_for_cpu` (tinygemm): w = (q - 8) * scale + zero, q in 0..15.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

GROUP_SIZE = 32   # GGUF's block size along in_features, and the int4 kernel's group size used here


@dataclass(frozen=True, slots=True)
class Int4Groups:
    """A 4-bit weight, one (scale, zero) per GROUP_SIZE consecutive inputs of each output row:
    w[n, k] = (qvals[n, k] - 8) * scales[n, k // 32] + zeros[n, k // 32].

    qvals: uint8 `[out, in]`, values 0..15. scales, zeros: float32 `[out, in // 32]`.
    GGUF Q4_0 (w = d * (q - 8)) is scale d, zero 0; Q4_1 (w = d * q + m) is scale d, zero m + 8d.
    """

    qvals: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """`[out_features, in_features]`."""
        return self.qvals.shape

    def dequantize(self) -> torch.Tensor:
        """The weight as float32 `[out, in]`."""
        groups = self.qvals.float().view(self.shape[0], -1, GROUP_SIZE) - 8
        return (groups * self.scales[..., None] + self.zeros[..., None]).view(self.shape)

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Int4Groups:
        """The weight with `fn` (a permutation or selection along dim 0) applied to every row field."""
        return Int4Groups(fn(self.qvals), fn(self.scales), fn(self.zeros))

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int4Groups:
        """Asymmetric min/max quantization of `weight` `[out, in]` (in a multiple of 32) per group:
        scale = (max - min) / 15, q = round((w - min) / scale); the error per value is at most
        scale / 2. Raises ValueError when in_features is not a multiple of GROUP_SIZE."""
        out_features, in_features = weight.shape
        if in_features % GROUP_SIZE:
            raise ValueError(f"int4 needs in_features divisible by {GROUP_SIZE}, got {in_features}")
        groups = weight.float().reshape(out_features, -1, GROUP_SIZE)
        low, high = groups.amin(-1), groups.amax(-1)
        scales = (high - low) / 15
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        qvals = ((groups - low[..., None]) / safe[..., None]).round_().clamp_(0, 15).to(torch.uint8)
        return cls(qvals.view(out_features, in_features), scales, low + 8 * scales)


@dataclass(frozen=True, slots=True)
class Int8Groups:
    """GGUF Q8_0: w[n, k] = qvals[n, k] * scales[n, k // 32]. qvals int8 `[out, in]`, scales
    float32 `[out, in // 32]`. Served as int8 per output channel (`Int8Channels`), re-quantized."""

    qvals: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """`[out_features, in_features]`."""
        return self.qvals.shape

    def dequantize(self) -> torch.Tensor:
        """The weight as float32 `[out, in]`."""
        groups = self.qvals.float().view(self.shape[0], -1, GROUP_SIZE)
        return (groups * self.scales[..., None]).view(self.shape)

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Int8Groups:
        """The weight with `fn` (a permutation or selection along dim 0) applied to every row field."""
        return Int8Groups(fn(self.qvals), fn(self.scales))


@dataclass(frozen=True, slots=True)
class Int8Channels:
    """Symmetric int8 per output channel, the layout of torch's `_weight_int8pack_mm`:
    w[n, k] = qvals[n, k] * scales[n]. qvals int8 `[out, in]`, scales float32 `[out]`."""

    qvals: torch.Tensor
    scales: torch.Tensor

    def dequantize(self) -> torch.Tensor:
        """The weight as float32 `[out, in]`."""
        return self.qvals.float() * self.scales[:, None]

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Channels:
        """scale = max |w| / 127 per row, q = round(w / scale); the error per value is at most scale / 2."""
        weight = weight.float()
        scales = weight.abs().amax(dim=1) / 127
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        qvals = (weight / safe[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        return cls(qvals, scales)


SourceWeight = torch.Tensor | Int4Groups | Int8Groups   # one checkpoint tensor, as loaded


def dequantize(weight: SourceWeight) -> torch.Tensor:
    """A source weight as a float tensor (float tensors come back unchanged, in their dtype)."""
    return weight if isinstance(weight, torch.Tensor) else weight.dequantize()


def cat_rows(parts: list[SourceWeight]) -> SourceWeight:
    """Parts stacked along dim 0 (fusing q/k/v or gate/up). Parts of one quantized kind stay
    quantized; a mix of kinds is dequantized to float32 first."""
    kinds = {type(part) for part in parts}
    if kinds == {Int4Groups}:
        int4 = [part for part in parts if isinstance(part, Int4Groups)]
        return Int4Groups(torch.cat([p.qvals for p in int4]), torch.cat([p.scales for p in int4]),
                          torch.cat([p.zeros for p in int4]))
    if kinds == {Int8Groups}:
        int8 = [part for part in parts if isinstance(part, Int8Groups)]
        return Int8Groups(torch.cat([p.qvals for p in int8]), torch.cat([p.scales for p in int8]))
    if len(kinds) == 1:
        return torch.cat(parts)  # type: ignore[arg-type]
    return torch.cat([dequantize(part).float() for part in parts])

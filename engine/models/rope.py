"""Rotary position embeddings in the Hugging Face "rotate_half" (GPT-NeoX) layout."""

from __future__ import annotations

import math
from typing import Any

import torch


def rope_inv_freq(
    head_dim: int,
    theta: float,
    rope_scaling: dict[str, Any] | None,
    freq_factors: torch.Tensor | None = None,  # [head_dim // 2] float32, GGUF "rope_freqs"
) -> torch.Tensor:
    """Inverse frequencies, float32 `[head_dim // 2]`, computed exactly as transformers does
    (default, "linear" and "llama3" scaling). `freq_factors` divides them (llama.cpp's baked-in
    llama3 scaling)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if freq_factors is not None:
        return inv_freq / freq_factors.to(torch.float32)
    if rope_scaling is None:
        return inv_freq
    factor = float(rope_scaling["factor"])
    if rope_scaling["rope_type"] == "linear":
        return inv_freq / factor
    low_freq_factor = rope_scaling["low_freq_factor"]
    high_freq_factor = rope_scaling["high_freq_factor"]
    old_context_len = rope_scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin_cache(inv_freq: torch.Tensor, max_positions: int, dtype: torch.dtype) -> torch.Tensor:
    """`[max_positions, head_dim]`: cos of every (position, frequency) then sin, cast to `dtype`
    after computing in float32 (as transformers does)."""
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)


def apply_rope(
    x: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    cos_sin: torch.Tensor,  # [num_tokens, head_dim], rows of rope_cos_sin_cache at the positions
) -> torch.Tensor:
    """Rotate `x` by its tokens' positions: `x * cos + rotate_half(x) * sin`; returns a new tensor."""
    half = x.shape[-1] // 2
    cos, sin = cos_sin.unsqueeze(1).chunk(2, dim=-1)  # [num_tokens, 1, head_dim // 2] each
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

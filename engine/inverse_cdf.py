"""Inverse-CDF draws: one uniform number per row picks a token from unnormalised probabilities."""

from __future__ import annotations

import torch
import torch.nn.functional as F

_BLOCK = 1024
_BELOW_ONE = 1.0 - 2.0**-53


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Position drawn in each row of `weights` with probability weights[r, i] / weights[r].sum().

    weights: float [num_rows, K], >= 0, each row with a positive entry (e.g. softmax probabilities
    with filtered tokens set to 0); uniforms: float64 [num_rows] in [0, 1). Returns int64 [num_rows];
    never a zero-weight position. The cumulative sums are float64 and, past 1024 columns,
    two-level (sums of blocks of 1024, then a cumsum inside the chosen block), so a 49,152-token
    row costs one vectorised sum instead of a float64 cumsum over the whole row.
    """
    num_rows, width = weights.shape
    if width <= _BLOCK:
        return _pick(weights.double(), uniforms)[0]
    blocks = F.pad(weights, (0, -width % _BLOCK)).view(num_rows, -1, _BLOCK)
    block_idx, residual = _pick(blocks.sum(dim=-1, dtype=torch.float64), uniforms)
    inside = blocks[torch.arange(num_rows), block_idx].double()                  # [num_rows, _BLOCK]
    return block_idx * _BLOCK + _pick(inside, residual)[0]


def _pick(weights: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One-level draw over float64 `weights` [n, K] >= 0: (position int64 [n], the uniform
    rescaled to [0, 1) within the chosen position's share, float64 [n], for a second level)."""
    cdf = weights.cumsum(dim=-1)
    target = uniforms * cdf[:, -1]
    pos = torch.searchsorted(cdf, target.unsqueeze(1), right=True).squeeze(1)
    # target == total only by rounding (a uniform just below 1): take the last positive weight
    last = weights.shape[1] - 1 - (weights > 0).flip(-1).to(torch.int8).argmax(dim=-1)
    pos = torch.minimum(pos, last)
    below = cdf.gather(1, (pos - 1).clamp_min(0).unsqueeze(1)).squeeze(1).masked_fill(pos == 0, 0.0)
    share = weights.gather(1, pos.unsqueeze(1)).squeeze(1)
    return pos, ((target - below) / share).clamp(0.0, _BELOW_ONE)

"""Token bitmask allocation and row helpers: int32 `[num_rows, ceil(vocab_size / 32)]`, CPU.

Bit `j` of word `w` set means token `32 * w + j` is allowed. Applying a bitmask to logits lives
in `kernels/apply_bitmask.py`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


def bitmask_width(vocab_size: int) -> int:
    """Number of int32 words per row for `vocab_size` tokens: ceil(vocab_size / 32)."""
    return (vocab_size + 31) // 32


def allocate_bitmask(num_rows: int, vocab_size: int) -> torch.Tensor:
    """A new all-allowed bitmask, int32 `[num_rows, ceil(vocab_size / 32)]` on CPU.

    Pinned when CUDA is available, so the host-to-device copy can be non_blocking.
    """
    pin = torch.cuda.is_available()
    return torch.full((num_rows, bitmask_width(vocab_size)), -1, dtype=torch.int32, pin_memory=pin)


def fill_all_ones(bitmask: torch.Tensor, rows: Iterable[int] | None = None) -> None:
    """Mark every token allowed in `rows` of `bitmask` (all rows when None); in place.

    `bitmask`: int32 `[num_rows, width]`. Used for requests without a grammar in a mixed batch.
    """
    if rows is None:
        bitmask.fill_(-1)
    else:
        bitmask[list(rows)] = -1


def allow_only(bitmask: torch.Tensor, row: int, token_ids: Iterable[int]) -> None:
    """Set `bitmask[row]` so exactly `token_ids` are allowed; in place.

    `bitmask`: int32 `[num_rows, width]`; ids must be < 32 * width (IndexError otherwise).
    """
    bitmask[row].zero_()
    words = bitmask[row]
    for token_id in token_ids:
        word, bit = divmod(token_id, 32)
        # int32 words: bit 31 is the sign bit, so OR in a signed value.
        value = (int(words[word]) & 0xFFFFFFFF) | (1 << bit)
        words[word] = value - (1 << 32) if value >= 1 << 31 else value


def check_bitmask(bitmask: torch.Tensor, row: int, vocab_size: int) -> None:
    """Validate a bitmask before a backend writes `row` of it through a raw pointer.

    Raises ValueError unless `bitmask` is a contiguous CPU int32 `[num_rows, ceil(vocab_size / 32)]`
    tensor and `0 <= row < num_rows`.
    """
    width = bitmask_width(vocab_size)
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2:
        raise ValueError(f"bitmask must be a 2-D int32 CPU tensor, got {bitmask.dtype} {bitmask.device}")
    if bitmask.shape[1] != width or not bitmask.is_contiguous():
        raise ValueError(f"bitmask must be contiguous [num_rows, {width}], got {tuple(bitmask.shape)}")
    if not 0 <= row < bitmask.shape[0]:
        raise ValueError(f"row {row} outside bitmask of {bitmask.shape[0]} rows")


def allowed_mask(bitmask: torch.Tensor, row: int, vocab_size: int) -> np.ndarray:
    """bool `[vocab_size]`: which token ids `bitmask[row]` allows (bit order as in the module doc)."""
    words = bitmask[row].numpy().view(np.uint8)
    return np.unpackbits(words, bitorder="little")[:vocab_size].astype(bool)


def allowed_token_ids(bitmask: torch.Tensor, row: int, vocab_size: int) -> list[int]:
    """The token ids allowed by `bitmask[row]`, ascending, below `vocab_size` (tests and debugging)."""
    return np.flatnonzero(allowed_mask(bitmask, row, vocab_size)).tolist()

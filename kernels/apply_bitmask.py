"""Apply a grammar token bitmask to logits in place: disallowed tokens become -inf.

Bitmask layout (STYLE §3): int32 `[num_rows, ceil(vocab_size / 32)]`; bit `j` of word `w` set
means token `32 * w + j` is allowed. Logits columns beyond `32 * width` are treated as disallowed.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs (e.g. aarch64) run the reference
    triton = None

_BLOCK_SIZE = 1024


def _check(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"need logits [N, V] and int32 bitmask [N, W]; got {tuple(logits.shape)}, "
                         f"{bitmask.dtype} {tuple(bitmask.shape)}")
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows, logits {logits.shape[0]}")


def apply_bitmask_ref(
    logits: torch.Tensor,                     # [num_rows, vocab_size] float, any device; modified in place
    bitmask: torch.Tensor,                    # [num_rows, ceil(vocab_size / 32)] int32, any device
    row_indices: torch.Tensor | None = None,  # [num_selected] int, rows to mask (others untouched)
) -> None:
    """Reference (plain torch): set `logits[r, t] = -inf` where bit t of `bitmask[r]` is clear.

    With `row_indices`, only those rows are masked, each with its own bitmask row (row r of the
    bitmask applies to row r of logits). The bitmask is moved to the logits' device.
    Raises ValueError on mismatched ranks, dtype or row counts.
    """
    _check(logits, bitmask)
    vocab_size, width = logits.shape[1], bitmask.shape[1]
    rows = bitmask.to(logits.device, non_blocking=True)
    if row_indices is not None:
        row_indices = row_indices.to(logits.device, torch.long)
        rows = rows[row_indices]
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((rows.unsqueeze(-1) >> shifts) & 1).reshape(rows.shape[0], width * 32).bool()
    if width * 32 >= vocab_size:
        allowed = allowed[:, :vocab_size]
    else:
        pad = torch.zeros(rows.shape[0], vocab_size - width * 32, dtype=torch.bool, device=logits.device)
        allowed = torch.cat([allowed, pad], dim=1)
    if row_indices is None:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        logits[row_indices] = logits[row_indices].masked_fill(~allowed, float("-inf"))


if triton is not None:

    @triton.jit
    def _apply_bitmask_kernel(
        logits_ptr, bitmask_ptr, row_indices_ptr,
        vocab_size, bitmask_width, logits_stride, bitmask_stride,
        HAS_INDICES: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    ):
        # grid: (num rows to mask, cdiv(vocab_size, BLOCK_SIZE)); one program masks BLOCK_SIZE logits.
        if HAS_INDICES:
            row = tl.load(row_indices_ptr + tl.program_id(0)).to(tl.int64)
        else:
            row = tl.program_id(0).to(tl.int64)
        offsets = tl.program_id(1) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        in_vocab = offsets < vocab_size
        words = offsets // 32
        packed = tl.load(bitmask_ptr + row * bitmask_stride + words,
                         mask=in_vocab & (words < bitmask_width), other=0)
        allowed = ((packed >> (offsets % 32)) & 1) != 0
        tl.store(logits_ptr + row * logits_stride + offsets, float("-inf"), mask=in_vocab & ~allowed)


def apply_bitmask_triton(
    logits: torch.Tensor,                     # [num_rows, vocab_size] float32/bf16/fp16, cuda (or CPU under TRITON_INTERPRET=1)
    bitmask: torch.Tensor,                    # [num_rows, ceil(vocab_size / 32)] int32, any device
    row_indices: torch.Tensor | None = None,  # [num_selected] int, rows to mask
) -> None:
    """Triton version of `apply_bitmask_ref` (same semantics, in place).

    Raises ValueError on bad shapes, RuntimeError when triton is not installed.
    """
    if triton is None:
        raise RuntimeError("triton is not installed; use apply_bitmask_ref")
    _check(logits, bitmask)
    if logits.stride(1) != 1:
        raise ValueError("logits rows must be contiguous")
    bitmask = bitmask.to(logits.device, non_blocking=True).contiguous()
    num_rows = logits.shape[0] if row_indices is None else row_indices.numel()
    if num_rows == 0:
        return
    indices = bitmask if row_indices is None else row_indices.to(logits.device, torch.int32).contiguous()
    grid = (num_rows, triton.cdiv(logits.shape[1], _BLOCK_SIZE))
    _apply_bitmask_kernel[grid](
        logits, bitmask, indices, logits.shape[1], bitmask.shape[1], logits.stride(0), bitmask.stride(0),
        HAS_INDICES=row_indices is not None, BLOCK_SIZE=_BLOCK_SIZE,
    )


def apply_bitmask(
    logits: torch.Tensor,                     # [num_rows, vocab_size] float; modified in place
    bitmask: torch.Tensor,                    # [num_rows, ceil(vocab_size / 32)] int32
    row_indices: torch.Tensor | None = None,  # [num_selected] int, rows to mask
) -> None:
    """Mask disallowed tokens to -inf in place: Triton on CUDA, the torch reference elsewhere.

    A CPU (pinned) bitmask is copied to the logits' device without blocking: do not refill it
    until the stream has passed this call (e.g. after the sampled ids reach the host).
    Raises ValueError on mismatched ranks, dtype or row counts.
    """
    if logits.is_cuda and triton is not None:
        apply_bitmask_triton(logits, bitmask, row_indices)
    else:
        apply_bitmask_ref(logits, bitmask, row_indices)

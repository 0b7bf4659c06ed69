"""Apply a grammar token bitmask to logits in place: disallowed tokens become -inf.

Bitmask layout (STYLE §3): int32 `[num_rows, ceil(vocab_size / 32)]`; bit `j` of word `w` set
means token `32 * w + j` is allowed. Logits columns beyond `32 * width` are treated as disallowed.
"""

from __future__ import annotations

import sys

import torch

from kernels.triton_runtime import tl, triton

_BLOCK_SIZE = 1024


def _check(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(f"need logits [N, V] and int32 bitmask [N, W]; got {tuple(logits.shape)}, "
                         f"{bitmask.dtype} {tuple(bitmask.shape)}")
    if bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"bitmask has {bitmask.shape[0]} rows, logits {logits.shape[0]}")


def _byte_limits(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[256, 8] table of `dtype` on `device`: entry [b, j] is +inf when bit j of byte b is set
    (allowed) and -inf when it is clear, so `minimum(logit, entry)` keeps or masks the logit."""
    bits = (torch.arange(256, device=device).unsqueeze(1) >> torch.arange(8, device=device)) & 1
    inf = torch.tensor(float("inf"), dtype=dtype, device=device)
    return torch.where(bits.bool(), inf, -inf)


def _bitmask_bytes(rows: torch.Tensor) -> torch.Tensor:
    """int32 [n, width] words -> uint8 [n, 4 * width] bytes, byte 4w + i holding bits 8i..8i+7 of word w."""
    as_bytes = rows.contiguous().view(torch.uint8)
    if sys.byteorder == "big":
        as_bytes = as_bytes.view(rows.shape[0], -1, 4).flip(-1).reshape(rows.shape[0], -1)
    return as_bytes


def apply_bitmask_ref(
    logits: torch.Tensor,                     # [num_rows, vocab_size] float, any device; modified in place
    bitmask: torch.Tensor,                    # [num_rows, ceil(vocab_size / 32)] int32, any device
    row_indices: torch.Tensor | None = None,  # [num_selected] int, rows to mask (others untouched)
) -> None:
    """Reference (plain torch): set `logits[r, t] = -inf` where bit t of `bitmask[r]` is clear.

    With `row_indices`, only those rows are masked, each with its own bitmask row (row r of the
    bitmask applies to row r of logits). The bitmask is moved to the logits' device.
    Vectorised without unpacking 32 shifts: each bitmask byte indexes a [256, 8] table of +inf /
    -inf, and `minimum` with that row keeps or masks each logit (one gather and one elementwise
    pass over [rows, vocab]; exact, since min(x, +inf) = x and min(x, -inf) = -inf; a NaN logit
    stays NaN). Raises ValueError on mismatched ranks, dtype or row counts.
    """
    _check(logits, bitmask)
    vocab_size, width = logits.shape[1], bitmask.shape[1]
    rows = bitmask.to(logits.device, non_blocking=True)
    if row_indices is not None:
        row_indices = row_indices.to(logits.device, torch.long)
        rows = rows[row_indices]
    num_rows = rows.shape[0]
    if num_rows == 0:
        return
    byte_ids = _bitmask_bytes(rows).reshape(-1).to(torch.int32)
    limits = torch.index_select(_byte_limits(logits.dtype, logits.device), 0, byte_ids).view(num_rows, width * 32)
    covered = min(vocab_size, width * 32)
    target = logits if row_indices is None else logits.index_select(0, row_indices)
    head = target[:, :covered]
    torch.minimum(head, limits[:, :covered], out=head)
    if covered < vocab_size:
        target[:, covered:] = float("-inf")
    if row_indices is not None:
        logits.index_copy_(0, row_indices, target)


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

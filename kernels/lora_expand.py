"""LoRA expand: `y[token] += scaling * s · B[slot]ᵀ`, the second half of a batched LoRA matmul.

`s` is the shrink output `[num_rows, rank]` float32 in the row layout of the step's
`LoraTokenIndex` (kernels/lora_index.py); each LoRA token's row of `y` is updated in place, base
tokens and padding rows are left alone. Each token has one row, so every output element has one
writer (no atomics). `lora_b` may be a view with a narrower rank than its buffer (last dimension
contiguous); its first dimension covers `index.num_slots`.

`lora_expand_ref` is the specification and the CPU path: one batched matmul and one `index_add_`
(padded layout), else one in-place addmm per segment (a batch ordered by slot), else one matmul
per slot and one `index_add_`.
"""

from __future__ import annotations

import torch

from kernels.lora_index import LoraTokenIndex

from kernels.triton_runtime import tl, triton


def lora_expand_ref(
    y: torch.Tensor,  # [num_tokens, out_features], updated in place
    s: torch.Tensor,  # [num_rows, rank] float32, the index's row layout (padding rows zero)
    lora_b: torch.Tensor,  # [num_slots, out_features, rank]
    index: LoraTokenIndex,
    scaling: float = 1.0,
) -> None:
    """Add `scaling * B[slot] @ s[row]` to row `row_token_idx[row]` of `y` for every real row."""
    if index.num_lora_tokens == 0:
        return
    s = s.to(lora_b.dtype)
    shape = (index.num_slots, index.max_tokens_per_slot, -1)
    if index.row_offset is not None and lora_b.dtype == y.dtype:    # rows are a slice of y's tokens
        offset = index.row_offset
        y[offset:offset + index.num_rows].view(shape).baddbmm_(s.view(shape), lora_b.transpose(1, 2), alpha=scaling)
        return
    if index.padded:   # padding rows of s are zero: they add nothing to token 0
        delta = torch.bmm(s.view(shape), lora_b.transpose(1, 2))
        y.index_add_(0, index.row_token_idx, delta.view(index.num_rows, -1).to(y.dtype), alpha=scaling)
        return
    if index.contiguous and lora_b.dtype == y.dtype:
        for slot, start, end, row in index.segments:
            y[start:end].addmm_(s[row:row + end - start], lora_b[slot].t(), alpha=scaling)
        return
    delta = torch.empty(index.num_rows, y.shape[1], dtype=lora_b.dtype, device=y.device)
    for slot, (start, count) in enumerate(zip(index.slot_start_list, index.slot_count_list)):
        if count:
            torch.matmul(s[start:start + count], lora_b[slot].t(), out=delta[start:start + count])
    y.index_add_(0, index.row_token_idx, delta.to(y.dtype), alpha=scaling)



if triton is not None:

    @triton.jit
    def _lora_expand_kernel(
        s_ptr, b_ptr, y_ptr, row_token_ptr, slot_start_ptr, slot_count_ptr,
        out_features, rank, scaling,
        stride_st, stride_bs, stride_bo, stride_yt,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    ):
        """Program (m block, output block, slot): BLOCK_M of the slot's tokens x BLOCK_N outputs."""
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        slot = tl.program_id(2)
        start = tl.load(slot_start_ptr + slot)
        end = start + tl.load(slot_count_ptr + slot)
        row0 = start + pid_m * BLOCK_M
        if row0 < end:
            offs_m = row0 + tl.arange(0, BLOCK_M)
            mask_m = offs_m < end
            tokens = tl.load(row_token_ptr + offs_m, mask=mask_m, other=0)
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask_n = offs_n < out_features
            b_base = b_ptr + slot.to(tl.int64) * stride_bs
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, rank, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                mask_k = offs_k < rank
                b = tl.load(b_base + offs_n[:, None] * stride_bo + offs_k[None, :],
                            mask=mask_n[:, None] & mask_k[None, :], other=0.0)
                s = tl.load(s_ptr + offs_m[:, None] * stride_st + offs_k[None, :],
                            mask=mask_m[:, None] & mask_k[None, :], other=0.0)
                acc += tl.dot(s, tl.trans(b.to(tl.float32)), input_precision=PRECISION)
            y_ptrs = y_ptr + tokens[:, None] * stride_yt + offs_n[None, :]
            mask = mask_m[:, None] & mask_n[None, :]
            y = tl.load(y_ptrs, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_ptrs, (y + acc * scaling).to(y_ptr.dtype.element_ty), mask=mask)


def lora_expand_triton(
    y: torch.Tensor,  # [num_tokens, out_features], cuda, last dim contiguous, updated in place
    s: torch.Tensor,  # [num_rows, rank] float32, cuda
    lora_b: torch.Tensor,  # [num_slots, out_features, rank], cuda, last dim contiguous
    index: LoraTokenIndex,
    scaling: float = 1.0,
) -> None:
    """Triton version of `lora_expand_ref` (same contract; no host sync).
    Raises RuntimeError without triton."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    out_features, rank = y.shape[1], lora_b.shape[2]
    if index.num_lora_tokens == 0 or rank == 0:
        return
    assert y.stride(1) == 1 and s.stride(1) == 1 and lora_b.stride(2) == 1
    assert lora_b.shape[1] == out_features and s.shape == (index.num_rows, rank)
    block_m = 16 if index.max_tokens_per_slot <= 16 else 64
    block_k = max(16, min(64, triton.next_power_of_2(rank)))
    grid = (triton.cdiv(index.max_tokens_per_slot, block_m), triton.cdiv(out_features, 64), index.num_slots)
    _lora_expand_kernel[grid](
        s, lora_b, y, index.row_token_idx, index.slot_start, index.slot_count,
        out_features, rank, float(scaling),
        s.stride(0), lora_b.stride(0), lora_b.stride(1), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=block_k,
        PRECISION="ieee" if lora_b.dtype == torch.float32 else "tf32",
    )


def lora_expand(
    y: torch.Tensor,  # [num_tokens, out_features], updated in place
    s: torch.Tensor,  # [num_rows, rank] float32
    lora_b: torch.Tensor,  # [num_slots, out_features, rank]
    index: LoraTokenIndex,
    scaling: float = 1.0,
) -> None:
    """Add the expanded LoRA delta into `y` in place: Triton on CUDA tensors, `lora_expand_ref`
    otherwise (see there for the contract)."""
    fn = lora_expand_triton if y.is_cuda and triton is not None else lora_expand_ref
    fn(y, s, lora_b, index, scaling)

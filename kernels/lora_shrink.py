"""LoRA shrink: `s = x · A[slot]ᵀ` for each token, the first half of a batched LoRA matmul.

Tokens of many adapters share one call (SGMV): with the step's `LoraTokenIndex`, slot `s`'s
tokens are rows `slot_start[s] : slot_start[s] + slot_count[s]` of the output `[num_rows, rank]`
float32 (see kernels/lora_index.py); padding rows of the padded layout are zero, tokens without
an adapter are not computed. `lora_a` may be a view with a narrower rank than its buffer (last
dimension contiguous); its first dimension covers `index.num_slots`.

`lora_shrink_ref` is the specification and the CPU path: one batched matmul over the slots
(padded layout), else one matmul per segment of consecutive tokens (a batch ordered by slot),
else one gather and one matmul per slot.
"""

from __future__ import annotations

import torch

from kernels.lora_index import LoraTokenIndex

from kernels.triton_runtime import tl, triton


def lora_shrink_ref(
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, rank, in_features]
    index: LoraTokenIndex,
) -> torch.Tensor:
    """`[num_rows, rank]` float32: row `slot_start[s] + i` is `A[s] @ x[row_token_idx[...]]` for
    `i < slot_count[s]`; padding rows are zero."""
    rank = lora_a.shape[1]
    if index.padded:
        offset = index.row_offset
        xs = x[offset:offset + index.num_rows] if offset is not None else x.index_select(0, index.row_token_idx)
        xs = xs.view(index.num_slots, index.max_tokens_per_slot, -1)
        out = torch.bmm(xs, lora_a.transpose(1, 2)).view(index.num_rows, rank).to(torch.float32)
        return out if index.row_valid is None else out.mul_(index.row_valid)
    out = torch.empty(index.num_rows, rank, dtype=torch.float32, device=x.device)
    if index.num_rows == 0:
        return out
    if index.contiguous:
        for slot, start, end, row in index.segments:
            if x.dtype == torch.float32:
                torch.matmul(x[start:end], lora_a[slot].t(), out=out[row:row + end - start])
            else:
                out[row:row + end - start] = x[start:end] @ lora_a[slot].t()
        return out
    xs = x.index_select(0, index.row_token_idx)
    for slot, (start, count) in enumerate(zip(index.slot_start_list, index.slot_count_list)):
        if count:
            out[start:start + count] = xs[start:start + count] @ lora_a[slot].t()
    return out



if triton is not None:

    @triton.jit
    def _lora_shrink_kernel(
        x_ptr, a_ptr, out_ptr, row_token_ptr, slot_start_ptr, slot_count_ptr,
        in_features, rank,
        stride_xt, stride_as, stride_ar, stride_ot,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    ):
        """Program (m block, rank block, slot): BLOCK_M of the slot's tokens x BLOCK_N ranks."""
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
            mask_n = offs_n < rank
            a_base = a_ptr + slot.to(tl.int64) * stride_as
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k0 in range(0, in_features, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                mask_k = offs_k < in_features
                x = tl.load(x_ptr + tokens[:, None] * stride_xt + offs_k[None, :],
                            mask=mask_m[:, None] & mask_k[None, :], other=0.0)
                a = tl.load(a_base + offs_n[:, None] * stride_ar + offs_k[None, :],
                            mask=mask_n[:, None] & mask_k[None, :], other=0.0)
                acc += tl.dot(x.to(tl.float32), tl.trans(a.to(tl.float32)), input_precision=PRECISION)
            tl.store(out_ptr + offs_m[:, None] * stride_ot + offs_n[None, :], acc,
                     mask=mask_m[:, None] & mask_n[None, :])


def lora_shrink_triton(
    x: torch.Tensor,  # [num_tokens, in_features], cuda, last dim contiguous
    lora_a: torch.Tensor,  # [num_slots, rank, in_features], cuda, last dim contiguous
    index: LoraTokenIndex,
) -> torch.Tensor:
    """Triton version of `lora_shrink_ref` (same contract; no host sync).
    Raises RuntimeError without triton."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    in_features, rank = x.shape[1], lora_a.shape[1]
    alloc = torch.zeros if index.padded else torch.empty     # padding rows stay zero
    out = alloc(index.num_rows, rank, dtype=torch.float32, device=x.device)
    if index.num_rows == 0 or rank == 0:
        return out
    assert x.stride(1) == 1 and lora_a.stride(2) == 1 and lora_a.shape[2] == in_features
    block_m = 16 if index.max_tokens_per_slot <= 16 else 64
    block_n = max(16, min(64, triton.next_power_of_2(rank)))
    grid = (triton.cdiv(index.max_tokens_per_slot, block_m), triton.cdiv(rank, block_n), index.num_slots)
    _lora_shrink_kernel[grid](
        x, lora_a, out, index.row_token_idx, index.slot_start, index.slot_count,
        in_features, rank,
        x.stride(0), lora_a.stride(0), lora_a.stride(1), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=64,
        # bf16/fp16 operands are exact in tf32; float32 ones need ieee for parity with the reference
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
    )
    return out


def lora_shrink(
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, rank, in_features]
    index: LoraTokenIndex,
) -> torch.Tensor:
    """`[num_rows, rank]` float32 shrink output in the index's row layout: Triton on CUDA tensors,
    `lora_shrink_ref` otherwise (see there for the contract)."""
    fn = lora_shrink_triton if x.is_cuda and triton is not None else lora_shrink_ref
    return fn(x, lora_a, index)

"""Paged attention: write a step's K/V into block caches and attend over each sequence's blocks.

Layout (STYLE §3): `k_cache` / `v_cache` are `[num_blocks, block_size, num_kv_heads, head_dim]`;
`slot_mapping[i] = block_id * block_size + offset` (-1 skips the write); sequence `i` owns query
rows `cu_seqlens_q[i]:cu_seqlens_q[i+1]`, which are the last `query_lens[i]` of its `seq_lens[i]`
tokens. Query token `j` of a sequence with context `c = seq_len - query_len` sees keys `0..c+j`.
Query head `h` reads KV head `h // (num_heads // num_kv_heads)` (grouped-query attention).

The `_ref` functions are the specification and also the CPU production path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cpu_ops import common_ops_loaded, register_fake
from kernels.triton_runtime import tl, triton


def write_kv_ref(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """Scatter `k`, `v` into the caches at `slot_mapping` (in place); rows with slot -1 are skipped.
    `k`/`v` are cast to the cache dtype."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    valid = slot_mapping >= 0
    if bool(valid.all()):
        k_flat.index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_flat.index_copy_(0, slot_mapping, v.to(v_cache.dtype))
        return
    rows = valid.nonzero().squeeze(1)
    slots = slot_mapping.index_select(0, rows)
    k_flat.index_copy_(0, slots, k.index_select(0, rows).to(k_cache.dtype))
    v_flat.index_copy_(0, slots, v.index_select(0, rows).to(v_cache.dtype))


def paged_attention_ref(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32, padded with -1
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, KV length after the step
    query_lens: list[int],  # num_seqs Python ints (same numbers as cu_seqlens_q's differences)
    seq_lens_list: list[int],  # num_seqs Python ints (same numbers as seq_lens)
    num_decodes: int,  # the first num_decodes sequences have query_len 1
    scale: float,  # softmax scale, usually head_dim ** -0.5
) -> torch.Tensor:
    """Causal attention of each query token over its sequence's paged K/V; returns `[num_tokens,
    num_heads, head_dim]` in q's dtype. The K/V of this step's tokens must already be in the caches
    (see `write_kv`). All decodes share one gather of their blocks and one length-masked
    `scaled_dot_product_attention` call; prefills run one by one (causal, offset by their context)."""
    out = torch.empty_like(q)
    if num_decodes > 0:
        out[:num_decodes] = _decode_ref(
            q[:num_decodes], k_cache, v_cache, block_tables[:num_decodes], seq_lens[:num_decodes],
            max(seq_lens_list[:num_decodes]), scale,
        )
    _prefill_ref(q, k_cache, v_cache, block_tables, query_lens, seq_lens_list, num_decodes, scale, out)
    return out


def _prefill_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 query_lens: list[int], seq_lens_list: list[int], num_decodes: int, scale: float,
                 out: torch.Tensor) -> None:
    """`paged_attention_ref`'s prefills (sequences from `num_decodes` on), one by one, into `out`'s
    rows from `num_decodes` on."""
    block_size = k_cache.shape[1]
    start = num_decodes
    for i in range(num_decodes, len(query_lens)):
        query_len, seq_len = query_lens[i], seq_lens_list[i]
        if query_len == 0:
            continue
        num_blocks = -(-seq_len // block_size)
        blocks = block_tables[i, :num_blocks].long()  # index_select: far faster than k_cache[blocks] on CPU
        keys = k_cache.index_select(0, blocks).flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)
        values = v_cache.index_select(0, blocks).flatten(0, 1)[:seq_len].transpose(0, 1).unsqueeze(0)
        queries = q[start : start + query_len].transpose(0, 1).unsqueeze(0)
        context_len = seq_len - query_len
        mask = None
        if context_len > 0:
            query_pos = torch.arange(context_len, seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device) <= query_pos[:, None]  # [query_len, seq_len]
        attn = F.scaled_dot_product_attention(
            queries, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask,
            is_causal=context_len == 0 and query_len > 1, scale=scale, enable_gqa=True,
        )
        out[start : start + query_len] = attn[0].transpose(0, 1)
        start += query_len


def _decode_ref(
    q: torch.Tensor,  # [num_decodes, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_decodes, max_blocks_per_seq] int32
    seq_lens: torch.Tensor,  # [num_decodes] int32
    max_seq_len: int,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence against all its keys; gathers every decode's blocks at once."""
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_blocks = -(-max_seq_len // block_size)
    blocks = block_tables[:, :num_blocks].clamp(min=0).long().flatten()
    # [num_seqs, num_kv_heads, num_keys, head_dim]
    keys = k_cache.index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    values = v_cache.index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    key_pos = torch.arange(num_blocks * block_size, device=q.device)
    mask = (key_pos[None, :] < seq_lens[:, None]).view(num_seqs, 1, 1, -1)
    queries = q.reshape(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    attn = F.scaled_dot_product_attention(
        queries, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask, scale=scale
    )
    return attn.reshape(num_seqs, num_heads, head_dim)


def write_kv_scratch(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """`write_kv_ref` without its host check: one `index_copy_` per cache, rows with slot -1 sent
    to the cache's last slot instead of being skipped, so the write traces into a compiled graph.

    The caller keeps the last block of each cache as a scratch block that no sequence owns (the
    model runner allocates one block more than the block pool hands out); its contents are garbage.
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    slots = torch.where(slot_mapping < 0, k_flat.shape[0] - 1, slot_mapping)
    k_flat.index_copy_(0, slots, k.to(k_cache.dtype))
    v_flat.index_copy_(0, slots, v.to(v_cache.dtype))


def paged_decode_attention(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim], one query token per sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32, padded with -1
    seq_lens: torch.Tensor,  # [num_seqs] int32, KV length after the step, >= 1
    scale: float,
) -> torch.Tensor:
    """Decode attention read in place from the block tables, `[num_seqs, num_heads, head_dim]` in
    q's dtype: the C++ kernel `torch.ops.structserve_cpu.paged_decode_attention`
    (kernels/cpu/paged_decode.cpp, or kernels/cpu_avx2/paged_decode.cpp on an AVX2 CPU without
    AVX-512: one task per sequence and KV head, each K and V row read once) where one of
    kernels/cpu_ops.py's libraries is loaded and q and the caches are float32 CPU tensors with
    head_dim a multiple of 16 (at most 256) and at most 8 query heads per KV head (rows that are
    consecutive tokens of one query, as `ModelRunner.prepare` lays out a prefill chunk or a forced
    run for the compiled step, go to `paged_prefill_attention`'s tiles there, which read each K/V
    row once per 16 tokens instead of once per token); else `paged_decode_reduction`. Both give
    `paged_attention_ref`'s numbers on an all-decode batch (float32 rounding). torch.compile
    traces the choice once per graph."""
    if _cpu_kernel_fits(q, k_cache):
        return torch.ops.structserve_cpu.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)
    return paged_decode_reduction(q, k_cache, v_cache, block_tables, seq_lens, scale)


def paged_prefill_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim], the prefills' query rows one after the other
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32, padded with -1
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32, from 0 to num_tokens
    seq_lens: torch.Tensor,  # [num_seqs] int32, KV length after the step
    scale: float,
) -> torch.Tensor:
    """Causal attention of prefill query rows over their sequences' paged K/V, read in place from
    the block tables: `[num_tokens, num_heads, head_dim]` float32, the numbers of `paged_attention_ref`
    with `num_decodes=0` (float32 rounding). The C++ kernel
    `torch.ops.structserve_cpu.paged_prefill_attention` (kernels/cpu/paged_prefill.h: one task per
    sequence, KV head and 16 query tokens, FlashAttention's online softmax over tiles of 64 keys,
    no gather of the contexts and no mask tensor); it needs `_cpu_kernel_fits` (a loaded library,
    float32 CPU tensors, head_dim a multiple of 16 up to 256, at most 8 query heads per KV head)
    and raises RuntimeError otherwise. Sequences with no query rows are allowed."""
    return torch.ops.structserve_cpu.paged_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens,
                                                           scale)


def _cpu_kernel_fits(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the C++ attention kernels (`paged_decode_attention`, `paged_prefill_attention`) take
    these tensors."""
    head_dim, group = q.shape[-1], q.shape[1] // k_cache.shape[2]
    return (common_ops_loaded() and q.device.type == "cpu" and q.dtype == torch.float32
            and k_cache.dtype == torch.float32 and head_dim % 16 == 0 and head_dim <= 256 and group <= 8)


def paged_decode_reduction(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """`paged_decode_attention` (same arguments and result) as torch ops for inductor to fuse:
    `[num_seqs, num_heads, head_dim]` in q's dtype, the same numbers as `paged_attention_ref` on an
    all-decode batch (float32 rounding).

    Written for torch.compile: `k_cache[block_tables]` appears only inside the QK and PV reductions
    and the length-masked softmax, so inductor emits loops that read each block where it lies, with
    no copy of the contexts (the gather-free formulation of the project research note
    shared/research/cpu-performance.md, section 6;
    vLLM's CPU paged attention reads blocks in place the same way, as tiled C++). Scores, softmax
    and sums run in float32. Eager, it does materialise the gathered blocks and a product G times
    their size (G = num_heads // num_kv_heads): use `paged_attention_ref` there.
    Keys at positions >= seq_lens (the tail of the last block, -1 padding read as block 0) are
    masked, so their contents never matter as long as they are finite (every cache write is).
    """
    num_seqs, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    tables = block_tables.clamp(min=0).long()
    keys = k_cache[tables].float()  # [num_seqs, max_blocks, block_size, num_kv_heads, head_dim]
    values = v_cache[tables].float()
    queries = q.float().view(num_seqs, 1, 1, num_kv_heads, group, head_dim)
    scores = (queries * keys.unsqueeze(4)).sum(-1) * scale  # [num_seqs, max_blocks, block_size, kv, group]
    key_pos = torch.arange(tables.shape[1] * block_size, device=q.device).view(1, -1, block_size, 1, 1)
    scores = scores.masked_fill(key_pos >= seq_lens.view(-1, 1, 1, 1, 1), float("-inf"))
    probs = (scores - scores.amax(dim=(1, 2), keepdim=True)).exp()
    out = (probs.unsqueeze(-1) * values.unsqueeze(4)).sum(dim=(1, 2)) / probs.sum(dim=(1, 2)).unsqueeze(-1)
    return out.view(num_seqs, num_heads, head_dim).to(q.dtype)


def _register_fake() -> None:
    """Shapes for torch.compile's tracing of the C++ kernels: the output is shaped like q."""
    @torch.library.register_fake("structserve_cpu::paged_decode_attention")
    def _(q, k_cache, v_cache, block_tables, seq_lens, scale):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("structserve_cpu::paged_prefill_attention")
    def _(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale):
        return torch.empty_like(q, memory_format=torch.contiguous_format)


register_fake(_register_fake)


if triton is not None:

    @triton.jit
    def _write_kv_kernel(
        k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
        stride_kt, stride_vt,
        ROW: tl.constexpr, ROW_PAD: tl.constexpr,
    ):
        """One program per token: copy its `num_kv_heads * head_dim` K and V values to its slot."""
        token = tl.program_id(0)
        slot = tl.load(slot_mapping_ptr + token)
        if slot >= 0:
            offs = tl.arange(0, ROW_PAD)
            mask = offs < ROW
            k = tl.load(k_ptr + token * stride_kt + offs, mask=mask)
            v = tl.load(v_ptr + token * stride_vt + offs, mask=mask)
            dst = slot.to(tl.int64) * ROW + offs
            tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
        block_tables_ptr, token_seq_idx_ptr, cu_seqlens_q_ptr, seq_lens_ptr,
        scale_log2,
        stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
        stride_cb, stride_cs, stride_ch,
        NUM_GROUPS: tl.constexpr, GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    ):
        """One program per (query token, KV head): online softmax over the token's visible keys,
        one cache block at a time, for all query heads of that KV head together."""
        token = tl.program_id(0)
        kv_head = tl.program_id(1)
        seq = tl.load(token_seq_idx_ptr + token)
        query_end = tl.load(cu_seqlens_q_ptr + seq + 1)
        seq_len = tl.load(seq_lens_ptr + seq)
        num_keys = seq_len - query_end + token + 1  # context + position in the query + 1

        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, DIM_PAD)
        offs_s = tl.arange(0, BLOCK_SIZE)
        heads = kv_head * NUM_GROUPS + offs_g
        qo_mask = (offs_g < NUM_GROUPS)[:, None] & (offs_d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + token * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=qo_mask, other=0.0).to(tl.float32) * scale_log2

        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
        for b in range(0, tl.cdiv(num_keys, BLOCK_SIZE)):
            block_id = tl.load(block_tables_ptr + seq * stride_bt + b).to(tl.int64)
            key_mask = b * BLOCK_SIZE + offs_s < num_keys
            kv_offs = (block_id * stride_cb + offs_s[:, None] * stride_cs + kv_head * stride_ch
                       + offs_d[None, :])
            kv_mask = key_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
            k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # [GROUP_PAD, BLOCK_SIZE]
            scores = tl.where(key_mask[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(tl.float32)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(out_ptr + token * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=qo_mask)


def write_kv_triton(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], cuda
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim], cuda
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous, cuda
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous, cuda
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip, cuda
) -> None:
    """Triton version of `write_kv_ref` (same contract; no host sync). Raises RuntimeError without triton."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape == v_cache.shape
    row = k_cache.shape[2] * k_cache.shape[3]
    k2, v2 = k.reshape(num_tokens, row), v.reshape(num_tokens, row)
    _write_kv_kernel[(num_tokens,)](
        k2, v2, k_cache, v_cache, slot_mapping, k2.stride(0), v2.stride(0),
        ROW=row, ROW_PAD=triton.next_power_of_2(row),
    )


def paged_attention_triton(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim], cuda
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], cuda
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], cuda
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32, cuda
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32, cuda
    seq_lens: torch.Tensor,  # [num_seqs] int32, cuda
    query_lens: list[int],
    seq_lens_list: list[int],
    num_decodes: int,
    scale: float,
) -> torch.Tensor:
    """Triton version of `paged_attention_ref` (same contract); `query_lens`, `seq_lens_list` and
    `num_decodes` are not needed by the kernel. Raises RuntimeError without triton."""
    if triton is None:
        raise RuntimeError("triton is not installed")
    num_tokens, num_heads, head_dim = q.shape
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    assert k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1 and q.stride(2) == 1
    num_seqs = seq_lens.shape[0]
    seq_ids = torch.arange(num_seqs, device=q.device, dtype=torch.int32)
    token_seq_idx = torch.repeat_interleave(seq_ids, cu_seqlens_q.diff(), output_size=num_tokens)
    num_groups = num_heads // num_kv_heads
    _paged_attention_kernel[(num_tokens, num_kv_heads)](
        q, k_cache, v_cache, out, block_tables, token_seq_idx, cu_seqlens_q, seq_lens,
        scale * 1.4426950408889634,  # log2(e): the kernel uses exp2
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_GROUPS=num_groups, GROUP_PAD=triton.next_power_of_2(num_groups),
        HEAD_DIM=head_dim, DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=block_size,
    )
    return out


def write_kv(
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim], contiguous
    slot_mapping: torch.Tensor,  # [num_tokens] int64, -1 = skip
) -> None:
    """Scatter K/V into the caches: Triton on CUDA tensors, `write_kv_ref` otherwise."""
    if k.is_cuda and triton is not None:
        write_kv_triton(k, v, k_cache, v_cache, slot_mapping)
    else:
        write_kv_ref(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    query_lens: list[int],
    seq_lens_list: list[int],
    num_decodes: int,
    scale: float,
) -> torch.Tensor:
    """Paged causal attention, `[num_tokens, num_heads, head_dim]`: Triton on CUDA tensors; on CPU,
    where the C++ kernels fit (`_cpu_kernel_fits`), the decodes through `paged_decode_attention`
    and the prefills through `paged_prefill_attention` (neither gathers its blocks);
    `paged_attention_ref` otherwise (see there for the contract)."""
    if q.is_cuda and triton is not None:
        return paged_attention_triton(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, query_lens,
                                      seq_lens_list, num_decodes, scale)
    if _cpu_kernel_fits(q, k_cache):
        if num_decodes == 0:
            return paged_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale)
        out = torch.empty_like(q)
        out[:num_decodes] = torch.ops.structserve_cpu.paged_decode_attention(
            q[:num_decodes], k_cache, v_cache, block_tables[:num_decodes], seq_lens[:num_decodes], scale)
        if num_decodes < len(query_lens):
            out[num_decodes:] = paged_prefill_attention(
                q[num_decodes:], k_cache, v_cache, block_tables[num_decodes:],
                cu_seqlens_q[num_decodes:] - num_decodes, seq_lens[num_decodes:], scale)
        return out
    return paged_attention_ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, query_lens, seq_lens_list,
                               num_decodes, scale)

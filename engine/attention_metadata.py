"""The flattened batch description that every attention layer reads in one step."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Where each token of the step reads and writes the paged KV cache.

    Tokens of the step are laid out sequence after sequence: sequence i owns query rows
    `cu_seqlens_q[i]:cu_seqlens_q[i+1]`, the last `query_len_i` tokens of its `seq_lens[i]`
    tokens (the rest, `seq_lens[i] - query_len_i`, are already in the cache).

    slot_mapping: int64 [num_tokens], block_id * block_size + offset; -1 skips the write.
    block_tables: int32 [num_seqs, max_blocks_per_seq], padded with -1 (use 0 when gathering).
    cu_seqlens_q: int32 [num_seqs + 1]. seq_lens: int32 [num_seqs], KV length after the step.
    query_lens / seq_lens_list: the same numbers as Python lists (CPU paths avoid .tolist()).
    num_decodes: the first `num_decodes` sequences have query_len 1 (decodes come first).
    decode_only: every sequence is a decode and the step runs as the compiled decode graph
        (engine/compiled_decode.py): attention reads the cache in place
        (`kernels.paged_attention.paged_decode_attention`) and slot -1 writes go to the cache's
        scratch block; only the tensors and this flag are read, so the graph never specialises on
        the Python lists and ints below. block_tables then has at least 2 columns.
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    query_lens: list[int]
    seq_lens_list: list[int]
    num_decodes: int
    block_size: int
    max_query_len: int
    max_seq_len: int
    decode_only: bool = False

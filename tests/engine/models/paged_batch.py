"""A hand-made paged KV cache for model tests: caches, block tables and AttentionMetadata per step.

Stands in for the real block pool and model runner: blocks are handed out in a shuffled order so
that no sequence's blocks are contiguous.
"""

from __future__ import annotations

import random

import torch

from engine.attention_metadata import AttentionMetadata
from engine.models.arch import ModelArch


class PagedBatch:
    """KV caches for `arch` plus per-sequence block tables; `step()` flattens one batch."""

    def __init__(
        self,
        arch: ModelArch,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> None:
        shape = (num_blocks, block_size, arch.num_kv_heads, arch.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(arch.num_layers)
        ]
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))
        random.Random(seed).shuffle(self.free_blocks)
        self.block_tables: dict[int, list[int]] = {}
        self.num_computed: dict[int, int] = {}

    def step(
        self, chunks: list[tuple[int, list[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """(input_ids, positions, meta) for `chunks` = [(seq_id, new token ids)], in the given order;
        leading chunks of one token count as decodes. Allocates blocks and advances the sequences."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        for seq_id, token_ids in chunks:
            table = self.block_tables.setdefault(seq_id, [])
            start = self.num_computed.get(seq_id, 0)
            end = start + len(token_ids)
            while len(table) * self.block_size < end:
                table.append(self.free_blocks.pop())
            input_ids += token_ids
            positions += range(start, end)
            slots += [table[p // self.block_size] * self.block_size + p % self.block_size
                      for p in range(start, end)]
            query_lens.append(len(token_ids))
            seq_lens.append(end)
            tables.append(table)
            self.num_computed[seq_id] = end
        num_decodes = 0
        while num_decodes < len(query_lens) and query_lens[num_decodes] == 1:
            num_decodes += 1
        width = max(len(table) for table in tables)
        block_tables = torch.full((len(tables), width), -1, dtype=torch.int32)
        for row, table in enumerate(tables):
            block_tables[row, : len(table)] = torch.tensor(table, dtype=torch.int32)
        cu_seqlens_q = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=block_tables,
            cu_seqlens_q=cu_seqlens_q,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            query_lens=query_lens,
            seq_lens_list=seq_lens,
            num_decodes=num_decodes,
            block_size=self.block_size,
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
        )
        return torch.tensor(input_ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64), meta

"""Paged KV-cache layouts for the attention kernel tests (test_paged_decode_attention.py,
test_paged_prefill_attention.py): block tables over blocks handed out in shuffled order, and
garbage written where no query may read."""

from __future__ import annotations

import random

import torch


def shuffled_block_tables(seq_lens: list[int], block_size: int, extra_columns: int = 1,
                          seed: int = 0) -> tuple[torch.Tensor, int]:
    """(block_tables int32 [len(seq_lens), widest + extra_columns], num_blocks): each sequence's
    blocks drawn from a shuffled pool (no sequence's blocks are contiguous), rows padded with -1;
    the pool has 4 blocks no table names."""
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 4
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    tables = torch.full((len(seq_lens), max(blocks_per_seq) + extra_columns), -1, dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        tables[i, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
    return tables, num_blocks


def poison_unread_slots(batch: dict) -> None:
    """Write NaN keys and huge values past each sequence's length in its last block, and in every
    block no table names (in place): a kernel that reads them gives NaN or a wrong answer. Values
    stay finite, since a masked key's value is still multiplied by its zero weight."""
    block_size = batch["k_cache"].shape[1]
    used = set()
    for row, n in zip(batch["block_tables"].tolist(), batch["seq_lens"].tolist()):
        last = row[(n - 1) // block_size]
        batch["k_cache"][last, (n - 1) % block_size + 1:] = float("nan")
        batch["v_cache"][last, (n - 1) % block_size + 1:] = 1e6
        used.update(b for b in row if b >= 0)
    for block in set(range(batch["k_cache"].shape[0])) - used:
        batch["k_cache"][block] = float("nan")
        batch["v_cache"][block] = -1e6

"""The KV block pool: allocation, reference counts and the automatic prefix cache."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from engine.block_hash import hash_full_blocks
from engine.sequence import Sequence


def max_cached_blocks(num_tokens: int, block_size: int) -> int:
    """The most full blocks a sequence of `num_tokens` tokens takes from the prefix cache:
    (num_tokens - 2) // block_size, none for a one-token prompt. At least two tokens are always
    left to compute: the last one's logits are needed, and a query of one token would run the
    decode attention kernel on CPU where a cold prefill computes the same token in the prefill
    kernel, whose sums round differently (the answer would depend on what the cache held)."""
    return max(num_tokens - 2, 0) // block_size


@dataclass(slots=True)
class PrefixCacheStats:
    """Prefix-cache counters in tokens: prompt tokens looked up, and those served by a hit."""

    queries: int = 0
    hits: int = 0


class BlockPool:
    """Owns every KV block and each sequence's `block_table` / `block_hashes`.

    A block is used while its ref_count > 0. Blocks with ref_count 0 sit in the free queue in
    LRU order (least recently freed first); a free block that still holds a full, hashed block
    stays in the prefix cache until it is handed out again (eviction = reuse). Invariant, checked
    by `check_invariants`: free + used = num_blocks, and ref counts equal the number of holders.
    Prefix hashes chain (parent digest, block tokens, adapter id; the cache salt in the first
    block); see engine/block_hash.py.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.hash_of_block: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_count 0 (cached or empty)."""
        return len(self.free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0.0 to 1.0."""
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of `seq`'s tokens, for a sequence with no blocks.

        At most `max_cached_blocks(num_tokens, block_size)` blocks match. Also fills
        `seq.block_hashes` for those blocks. Changes no ref count and no counter: pass the result
        to `allocate_slots`, and count the lookup with `record_prefix_query` once the sequence is
        admitted.
        """
        assert not seq.block_table
        if not self.enable_prefix_caching:
            return []
        max_blocks = max_cached_blocks(seq.num_tokens, self.block_size)
        seq.block_hashes = hash_full_blocks(
            seq.token_ids, self.block_size, seq.adapter_id, seq.block_hashes[:max_blocks],
            max_blocks * self.block_size, seq.cache_salt)
        hits: list[int] = []
        for block_hash in seq.block_hashes[:max_blocks]:
            block_id = self.cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted lookup: `num_tokens` prompt tokens queried, `num_hit_tokens` served."""
        if self.enable_prefix_caching:
            self.stats.queries += num_tokens
            self.stats.hits += num_hit_tokens

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int] | None = None) -> bool:
        """Reserve KV space so that `seq` can hold num_computed + cached + num_new_tokens tokens.

        `cached_blocks` (from find_cached_prefix) are taken first. Appends to `seq.block_table`.
        Returns False and changes nothing when too few blocks are free.
        """
        cached_blocks = cached_blocks or []
        num_tokens = seq.num_computed_tokens + len(cached_blocks) * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_needed(num_tokens) - len(seq.block_table) - len(cached_blocks)
        num_revived = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        if num_new_blocks + num_revived > len(self.free):
            return False
        for block_id in cached_blocks:
            if self.ref_counts[block_id] == 0:
                del self.free[block_id]
            self.ref_counts[block_id] += 1
        seq.block_table.extend(cached_blocks)
        for _ in range(max(num_new_blocks, 0)):
            block_id, _ = self.free.popitem(last=False)
            old_hash = self.hash_of_block[block_id]
            if old_hash is not None:
                self.hash_of_block[block_id] = None
                if self.cached.get(old_hash) == block_id:
                    del self.cached[old_hash]
            self.ref_counts[block_id] = 1
            seq.block_table.append(block_id)
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Enter `seq`'s newly completed full blocks (tokens all computed) into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        if num_full == 0:
            return
        seq.block_hashes = hash_full_blocks(
            seq.token_ids, self.block_size, seq.adapter_id, seq.block_hashes[:num_full], seq.num_computed_tokens,
            seq.cache_salt)
        for block_idx in range(num_full):
            block_id = seq.block_table[block_idx]
            if self.hash_of_block[block_id] is not None:
                continue
            block_hash = seq.block_hashes[block_idx]
            if block_hash not in self.cached:
                self.cached[block_hash] = block_id
                self.hash_of_block[block_id] = block_hash

    def free_seq(self, seq: Sequence) -> None:
        """Drop `seq`'s hold on its blocks (tail first, so tails are evicted before shared heads)."""
        for block_id in reversed(seq.block_table):
            self.ref_counts[block_id] -= 1
            assert self.ref_counts[block_id] >= 0
            if self.ref_counts[block_id] == 0:
                self.free[block_id] = None
        seq.block_table = []

    def reset_prefix_cache(self) -> None:
        """Forget every cached block digest (blocks in use keep their contents)."""
        self.cached.clear()
        self.hash_of_block = [None] * self.num_blocks

    def check_invariants(self, holders: list[Sequence]) -> None:
        """Assert free + used = total and that ref counts equal the number of holding sequences."""
        expected = [0] * self.num_blocks
        for seq in holders:
            for block_id in seq.block_table:
                expected[block_id] += 1
        assert expected == self.ref_counts, "ref counts differ from holders"
        assert all((self.ref_counts[b] == 0) == (b in self.free) for b in range(self.num_blocks))
        used = sum(1 for c in self.ref_counts if c > 0)
        assert used + len(self.free) == self.num_blocks
        for block_hash, block_id in self.cached.items():
            assert self.hash_of_block[block_id] == block_hash

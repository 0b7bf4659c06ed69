"""Block pool: allocation, ref counts, prefix cache hits and LRU eviction."""

from engine.block_pool import BlockPool
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def make_seq(seq_id: int, tokens: list[int], adapter_id: int = 0,
             cache_salt: str | None = None) -> Sequence:
    return Sequence(seq_id=seq_id, request_id=f"r{seq_id}", index=0, token_ids=list(tokens),
                    num_prompt_tokens=len(tokens), sampling_params=SamplingParams(), arrival_time=0.0,
                    adapter_id=adapter_id, cache_salt=cache_salt)


def run_prefill(pool: BlockPool, seq: Sequence) -> None:
    cached = pool.find_cached_prefix(seq)
    assert pool.allocate_slots(seq, seq.num_tokens - len(cached) * pool.block_size, cached)
    seq.num_computed_tokens = seq.num_tokens
    pool.cache_full_blocks(seq)


def test_allocate_and_free_keeps_invariants():
    pool = BlockPool(num_blocks=8, block_size=4)
    a, b = make_seq(0, list(range(10))), make_seq(1, list(range(100, 105)))
    assert pool.allocate_slots(a, 10)
    assert pool.allocate_slots(b, 5)
    assert len(a.block_table) == 3 and len(b.block_table) == 2
    pool.check_invariants([a, b])
    assert not pool.allocate_slots(make_seq(2, [1] * 20), 20), "needs 5 blocks, 3 free"
    pool.check_invariants([a, b])
    pool.free_seq(a)
    pool.check_invariants([b])
    assert pool.num_free_blocks == 6


def test_prefix_hit_shares_blocks_and_counts_tokens():
    pool = BlockPool(num_blocks=16, block_size=4)
    prompt = list(range(14))
    a = make_seq(0, prompt)
    run_prefill(pool, a)
    b = make_seq(1, prompt)
    cached = pool.find_cached_prefix(b)
    assert cached == a.block_table[:3], "3 full blocks of 4; the last two tokens are always recomputed"
    assert pool.find_cached_prefix(make_seq(2, prompt[:13])) == a.block_table[:2], "13: 3 blocks leave 1"
    pool.record_prefix_query(b.num_tokens, len(cached) * pool.block_size)
    assert pool.stats.hits == 12 and pool.stats.queries == 14
    assert pool.allocate_slots(b, 2, cached)
    assert len(b.block_table) == 4
    assert pool.ref_counts[cached[0]] == 2
    pool.check_invariants([a, b])


def test_adapter_id_isolates_prefix_cache():
    pool = BlockPool(num_blocks=16, block_size=4)
    run_prefill(pool, make_seq(0, list(range(10)), adapter_id=1))
    assert pool.find_cached_prefix(make_seq(1, list(range(10)), adapter_id=2)) == []
    assert len(pool.find_cached_prefix(make_seq(2, list(range(10)), adapter_id=1))) == 2


def test_cache_salt_isolates_prefix_cache():
    """Different salts (or salt vs none) share no block; the same salt shares every full block."""
    pool = BlockPool(num_blocks=32, block_size=4)
    prompt = list(range(14))
    run_prefill(pool, make_seq(0, prompt, cache_salt="tenant-a"))
    assert pool.find_cached_prefix(make_seq(1, prompt, cache_salt="tenant-b")) == []
    assert pool.find_cached_prefix(make_seq(2, prompt)) == []
    assert len(pool.find_cached_prefix(make_seq(3, prompt, cache_salt="tenant-a"))) == 3
    run_prefill(pool, make_seq(4, prompt))
    assert len(pool.find_cached_prefix(make_seq(5, prompt))) == 3
    assert pool.find_cached_prefix(make_seq(6, prompt, cache_salt="tenant-b")) == []


def test_freed_cached_blocks_are_revived_then_evicted_lru():
    pool = BlockPool(num_blocks=4, block_size=2)
    a = make_seq(0, [1, 2, 3, 4, 5, 6])
    run_prefill(pool, a)
    pool.free_seq(a)
    assert pool.num_free_blocks == 4
    b = make_seq(1, [1, 2, 3, 4, 9, 9])
    cached = pool.find_cached_prefix(b)
    assert len(cached) == 2, "blocks with ref_count 0 still serve hits"
    assert pool.allocate_slots(b, 2, cached)
    b.num_computed_tokens = 6
    pool.check_invariants([b])
    pool.free_seq(b)
    c = make_seq(2, [7] * 8)
    assert pool.allocate_slots(c, 8)
    pool.check_invariants([c])
    assert pool.find_cached_prefix(make_seq(3, [1, 2, 3, 4, 5, 6])) == []


def test_disabled_prefix_cache_never_hits():
    pool = BlockPool(num_blocks=8, block_size=2, enable_prefix_caching=False)
    run_prefill(pool, make_seq(0, [1, 2, 3, 4, 5]))
    assert pool.find_cached_prefix(make_seq(1, [1, 2, 3, 4, 5])) == []

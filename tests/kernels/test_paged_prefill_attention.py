"""paged_prefill_attention (the C++ kernel of kernels/cpu/paged_prefill.h, in whichever library this
CPU loads) against the reference `paged_attention_ref`, and `paged_attention`'s CPU dispatch of
mixed steps (decodes to the decode kernel, prefills to this one).

Tolerance: float32 within 1e-5 of the reference (observed ~2e-6 at head_dim 256).
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import cpu_supports_common_ops, load_common_ops
from kernels.paged_attention import paged_attention, paged_attention_ref, paged_prefill_attention
from tests.kernels.paged_batches import poison_unread_slots, shuffled_block_tables

pytestmark = pytest.mark.skipif(
    not cpu_supports_common_ops(),
    reason="this CPU has neither AVX512-VNNI nor AVX2 and FMA for the C++ attention kernels")

# (num_heads, num_kv_heads, head_dim, block_size, [(query_len, context_len), ...])
CASES = {
    # a tools prompt's question after its cached definitions, and a cold prompt
    "smollm2_cached_prefix": (9, 3, 64, 16, [(40, 328)]),
    "smollm2_cold": (9, 3, 64, 16, [(40, 0)]),
    # query tiles of 16 tokens and key tiles of 64 keys: either side of each edge
    "smollm2_tile_edges": (9, 3, 64, 16, [(1, 0), (15, 1), (16, 48), (17, 47), (33, 63), (64, 64), (65, 0)]),
    "smollm2_long_chunk": (9, 3, 64, 16, [(256, 768)]),
    "mha_small_blocks": (4, 4, 16, 4, [(5, 7), (12, 0), (3, 30)]),
    "mqa_group_8": (8, 1, 32, 8, [(20, 9), (1, 1), (24, 40)]),
    "gqa_head_dim_128": (8, 2, 128, 32, [(20, 50), (5, 3)]),
    "gqa_head_dim_256": (16, 2, 256, 16, [(70, 65)]),
    # few tokens over a long context: a tile whose keys all its rows see reach 2 x 1,024 is split
    # into tasks of 1,024 keys (the last one to its end) and their softmax states merged
    "smollm2_split_keys": (9, 3, 64, 16, [(5, 2950), (37, 2100), (1, 2047), (3, 2047), (2, 3500), (16, 1008)]),
    # a sequence with no query rows this step (its rows are elsewhere in the step)
    "empty_query": (9, 3, 64, 16, [(8, 20), (0, 30), (9, 0)]),
}


def make_prefill_batch(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                       lens: list[tuple[int, int]], extra_columns: int = 1, seed: int = 0) -> dict:
    """A prefill step of sequences with `(query_len, context_len)` each, over a cache of random
    blocks handed out in shuffled order, block tables padded by `extra_columns` of -1."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in lens]
    tables, num_blocks = shuffled_block_tables(seq_lens, block_size, extra_columns, seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    query_lens = [q for q, _ in lens]
    return {
        "q": torch.randn(sum(query_lens), num_heads, head_dim, generator=gen),
        "k_cache": torch.randn(shape, generator=gen),
        "v_cache": torch.randn(shape, generator=gen),
        "block_tables": tables,
        "cu_seqlens_q": torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
        "query_lens": query_lens,
        "scale": head_dim**-0.5,
    }


def reference(batch: dict, num_decodes: int = 0) -> torch.Tensor:
    return paged_attention_ref(batch["q"], batch["k_cache"], batch["v_cache"], batch["block_tables"],
                               batch["cu_seqlens_q"], batch["seq_lens"], batch["query_lens"],
                               batch["seq_lens"].tolist(), num_decodes, batch["scale"])


def kernel(batch: dict) -> torch.Tensor:
    load_common_ops()
    return paged_prefill_attention(batch["q"], batch["k_cache"], batch["v_cache"], batch["block_tables"],
                                   batch["cu_seqlens_q"], batch["seq_lens"], batch["scale"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_reference(name: str) -> None:
    batch = make_prefill_batch(*CASES[name])
    out = kernel(batch)
    assert out.shape == batch["q"].shape and out.dtype == torch.float32
    torch.testing.assert_close(out, reference(batch), atol=1e-5, rtol=0)


def test_keys_past_each_query_and_stale_blocks_are_never_read() -> None:
    """NaN keys and huge values past each sequence's length, in blocks no table names, and in the
    causal future of a query (written after the reference ran) leave the result unchanged."""
    batch = make_prefill_batch(9, 3, 64, 16, [(17, 23), (40, 0), (5, 60)], extra_columns=3)
    expected = reference(batch)
    poison_unread_slots(batch)
    torch.testing.assert_close(kernel(batch), expected, atol=1e-5, rtol=0)


def test_a_sequence_gets_the_same_bits_alone_in_any_batch_and_thread_count() -> None:
    """Tasks depend only on their own sequence: its rows are bitwise equal computed alone with one
    thread and inside a batch with two."""
    batch = make_prefill_batch(9, 3, 64, 16, [(3, 100), (40, 328), (70, 2100)])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = kernel(batch)
        torch.set_num_threads(1)
        alone = dict(batch, q=batch["q"][3:43], block_tables=batch["block_tables"][1:2],
                     cu_seqlens_q=torch.tensor([0, 40], dtype=torch.int32), seq_lens=batch["seq_lens"][1:2],
                     query_lens=[40])
        assert torch.equal(kernel(alone), together[3:43])
    finally:
        torch.set_num_threads(threads)


def test_paged_attention_sends_a_mixed_step_to_both_kernels() -> None:
    """Decodes first, then prefills, as the model runner orders a step: the dispatcher's result
    equals the reference's on every row."""
    load_common_ops()
    batch = make_prefill_batch(9, 3, 64, 16, [(1, 30), (1, 7), (1, 200), (24, 40), (9, 0)])
    out = paged_attention(batch["q"], batch["k_cache"], batch["v_cache"], batch["block_tables"],
                          batch["cu_seqlens_q"], batch["seq_lens"], batch["query_lens"],
                          batch["seq_lens"].tolist(), 3, batch["scale"])
    torch.testing.assert_close(out, reference(batch, num_decodes=3), atol=1e-5, rtol=0)


def test_the_kernel_refuses_tables_and_starts_outside_the_contract() -> None:
    batch = make_prefill_batch(9, 3, 64, 16, [(8, 20), (9, 0)])
    missing = dict(batch, block_tables=batch["block_tables"].clone())
    missing["block_tables"][0, 1] = -1
    with pytest.raises(RuntimeError, match="a block the context needs is not in the cache"):
        kernel(missing)
    with pytest.raises(RuntimeError, match="cu_seqlens_q must run from 0 to q's rows"):
        kernel(dict(batch, cu_seqlens_q=torch.tensor([0, 8, 16], dtype=torch.int32)))
    with pytest.raises(RuntimeError, match="query or sequence lengths out of range"):
        kernel(dict(batch, seq_lens=torch.tensor([5, 9], dtype=torch.int32)))


def test_the_decode_operator_runs_a_query_laid_out_as_rows_through_the_prefill_tiles() -> None:
    """The compiled step lays a multi-token query out as one decode row per token (its table
    repeated, KV lengths context+1 .. context+n): `paged_decode_attention` finds such runs and
    computes them as this kernel does (the same bits), beside true decodes (which match the
    reference) and a run of another sequence right after."""
    load_common_ops()
    batch = make_prefill_batch(9, 3, 64, 16, [(1, 50), (40, 328), (1, 90), (7, 20)])
    prefill = kernel(batch)
    tables, lens = [], []
    for row, (query_len, seq_len) in enumerate(zip(batch["query_lens"], batch["seq_lens"].tolist())):
        for j in range(query_len):
            tables.append(batch["block_tables"][row])
            lens.append(seq_len - query_len + j + 1)
    rows = torch.ops.structserve_cpu.paged_decode_attention(
        batch["q"], batch["k_cache"], batch["v_cache"], torch.stack(tables), torch.tensor(lens, dtype=torch.int32),
        batch["scale"])
    assert torch.equal(rows[1:41], prefill[1:41]) and torch.equal(rows[42:], prefill[42:])
    torch.testing.assert_close(rows, reference(batch), atol=1e-5, rtol=0)


def test_a_decode_row_beside_a_sibling_sharing_its_blocks_keeps_its_own_bits() -> None:
    """A sequence of 32 tokens (its last token written again into a shared full block, as a full
    prefix-cache hit does) and one of 33 sharing those two blocks have consecutive lengths and
    agree on every block the first reads: they are still two sequences, so the decode operator
    gives the first the bits it gets alone."""
    load_common_ops()
    gen = torch.Generator().manual_seed(5)
    k_cache, v_cache = torch.randn(6, 16, 3, 64, generator=gen), torch.randn(6, 16, 3, 64, generator=gen)
    q = torch.randn(2, 9, 64, generator=gen)
    tables = torch.tensor([[0, 1, -1], [0, 1, 4]], dtype=torch.int32)
    both = torch.ops.structserve_cpu.paged_decode_attention(q, k_cache, v_cache, tables,
                                                            torch.tensor([32, 33], dtype=torch.int32), 0.125)
    alone = torch.ops.structserve_cpu.paged_decode_attention(q[:1], k_cache, v_cache, tables[:1],
                                                             torch.tensor([32], dtype=torch.int32), 0.125)
    assert torch.equal(both[:1], alone)


def test_a_nan_query_gives_nan_as_the_reference_does_and_leaves_other_rows_alone() -> None:
    """A NaN upstream must show as NaN in that row's output (the softmax's exponential keeps it),
    not as a plausible average of the values; rows of other tokens are unchanged."""
    batch = make_prefill_batch(9, 3, 64, 16, [(20, 40)])
    expected = kernel(batch)
    batch["q"][5, 4, 0] = float("nan")
    out = kernel(batch)
    assert reference(batch)[5, 4].isnan().all() and out[5, 4].isnan().all()
    keep = torch.ones(20, 9, dtype=torch.bool)
    keep[5, 4] = False
    assert torch.equal(out[keep], expected[keep])
    decode = make_prefill_batch(9, 3, 64, 16, [(1, 40), (1, 9)])
    decode["q"][1, 2, 3] = float("nan")
    rows = torch.ops.structserve_cpu.paged_decode_attention(decode["q"], decode["k_cache"], decode["v_cache"],
                                                            decode["block_tables"], decode["seq_lens"], decode["scale"])
    assert rows[1, 2].isnan().all() and not rows[0].isnan().any()

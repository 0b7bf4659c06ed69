"""paged_decode_attention (the in-place decode attention the compiled step traces) against the
reference `paged_attention_ref`, eager and compiled, in both its forms: the C++ kernel
(kernels/cpu/paged_decode.cpp where the CPU has AVX512-VNNI, else kernels/cpu_avx2/paged_decode.cpp
where it has AVX2 and FMA) and the torch reduction inductor fuses; write_kv_scratch against write_kv_ref.

Tolerance: float32 within 1e-5 of the reference (observed ~5e-7); bfloat16 caches within 2e-2.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_ops import cpu_supports_common_ops, load_common_ops
from kernels.paged_attention import (
    paged_attention_ref,
    paged_decode_attention,
    paged_decode_reduction,
    write_kv_ref,
    write_kv_scratch,
)
from tests.kernels.paged_batches import poison_unread_slots, shuffled_block_tables


def cpu_kernel(q, k_cache, v_cache, block_tables, seq_lens, scale) -> torch.Tensor:
    """The C++ kernel itself (the library loaded first)."""
    load_common_ops()
    return torch.ops.structserve_cpu.paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale)


NEEDS_KERNEL = pytest.mark.skipif(not cpu_supports_common_ops(),
                                  reason="this CPU has neither AVX512-VNNI nor AVX2 and FMA for the C++ decode attention")
IMPLEMENTATIONS = [pytest.param(cpu_kernel, id="cpu_kernel", marks=NEEDS_KERNEL),
                   pytest.param(paged_decode_reduction, id="reduction")]

# (num_heads, num_kv_heads, head_dim, block_size, context lengths incl. the new token)
CASES = {
    "smollm2_gqa_block_edges": (9, 3, 64, 16, [1, 15, 16, 17, 31, 32, 33, 100]),
    "smollm2_gqa_one_seq": (9, 3, 64, 16, [250]),
    "mha": (4, 4, 16, 4, [5, 12, 3, 8]),
    "mqa": (8, 1, 32, 8, [9, 1, 24, 40]),
    "gqa_4_2_long": (4, 2, 16, 16, [500, 7]),
    # the AVX2 kernel's value accumulators go 64 columns at a time, then the rest (48: 6 vectors);
    # its scores 8 keys at a time, then one by one (13, 100)
    "gqa_head_dim_48": (4, 2, 48, 16, [33, 9]),
    "gqa_head_dim_256": (8, 2, 256, 16, [13, 100]),
    # the kernel splits a sequence into tasks of 512 keys and merges their softmax states: one
    # chunk exactly, one key past it, three chunks, beside a short sequence
    "smollm2_split_keys": (9, 3, 64, 16, [512, 513, 1500, 20]),
}


def make_decode_batch(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, seq_lens: list[int],
                      extra_columns: int = 1, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    """A decode batch over a cache of random blocks handed out in shuffled order (no sequence's
    blocks are contiguous), with block tables padded by `extra_columns` of -1 past the widest."""
    gen = torch.Generator().manual_seed(seed)
    tables, num_blocks = shuffled_block_tables(seq_lens, block_size, extra_columns, seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return {
        "q": torch.randn(len(seq_lens), num_heads, head_dim, generator=gen).to(dtype),
        "k_cache": torch.randn(shape, generator=gen).to(dtype),   # unused slots hold garbage
        "v_cache": torch.randn(shape, generator=gen).to(dtype),
        "block_tables": tables,
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
        "scale": head_dim**-0.5,
    }


def reference(batch: dict) -> torch.Tensor:
    """paged_attention_ref on the batch as an all-decode step."""
    num_seqs = batch["q"].shape[0]
    seq_lens = batch["seq_lens"].tolist()
    return paged_attention_ref(
        batch["q"], batch["k_cache"], batch["v_cache"], batch["block_tables"],
        torch.arange(num_seqs + 1, dtype=torch.int32), batch["seq_lens"], [1] * num_seqs, seq_lens, num_seqs,
        batch["scale"])


def decode(fn, batch: dict) -> torch.Tensor:
    return fn(batch["q"], batch["k_cache"], batch["v_cache"], batch["block_tables"], batch["seq_lens"],
              batch["scale"])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_reference_eager(name: str, impl) -> None:
    batch = make_decode_batch(*CASES[name])
    out = decode(impl, batch)
    assert out.shape == batch["q"].shape and out.dtype == torch.float32
    torch.testing.assert_close(out, reference(batch), atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_padding_columns_and_stale_blocks_are_never_read(impl) -> None:
    """Wider -1 padding, and garbage past each sequence's length in its last block and in blocks no
    table points at, leave the result unchanged (NaN keys are masked out; values are only ever
    multiplied by a zero weight there, so they need to be finite, as every cache write is)."""
    batch = make_decode_batch(9, 3, 64, 16, [17, 40, 5], extra_columns=3)
    expected = reference(batch)
    poison_unread_slots(batch)
    torch.testing.assert_close(decode(impl, batch), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_preempted_and_resumed_sequence_in_recycled_blocks(impl) -> None:
    """A sequence preempted (blocks freed), its blocks handed to another sequence, then resumed in
    different, recycled blocks; plus two sequences sharing prefix blocks (prefix cache hit)."""
    heads, kv_heads, dim, bs = 9, 3, 64, 16
    gen = torch.Generator().manual_seed(3)
    k_cache = torch.randn(12, bs, kv_heads, dim, generator=gen)
    v_cache = torch.randn(12, bs, kv_heads, dim, generator=gen)
    keys = torch.randn(40, kv_heads, dim, generator=gen)
    values = torch.randn(40, kv_heads, dim, generator=gen)
    # first life in blocks [0, 1, 2]; after preemption those blocks were rewritten by another sequence
    k_cache[[0, 1, 2]] = torch.randn(3, bs, kv_heads, dim, generator=gen)
    resumed = [7, 2, 9]                      # recomputed into recycled blocks, one of them reused
    for pos in range(40):
        k_cache[resumed[pos // bs], pos % bs] = keys[pos]
        v_cache[resumed[pos // bs], pos % bs] = values[pos]
    shared_prefix = [resumed[0], resumed[1], 4]   # shares the first 32 tokens' blocks
    tables = torch.tensor([resumed + [-1], shared_prefix + [-1]], dtype=torch.int32)
    batch = {"q": torch.randn(2, heads, dim, generator=gen), "k_cache": k_cache, "v_cache": v_cache,
             "block_tables": tables, "seq_lens": torch.tensor([40, 36], dtype=torch.int32), "scale": dim**-0.5}
    out = decode(impl, batch)
    torch.testing.assert_close(out, reference(batch), atol=1e-5, rtol=0)
    group = heads // kv_heads                # the resumed sequence, against dense attention
    scores = torch.einsum("hd,khd->hk", batch["q"][0], keys.repeat_interleave(group, 1)) * dim**-0.5
    dense = torch.einsum("hk,khd->hd", scores.softmax(-1), values.repeat_interleave(group, 1))
    torch.testing.assert_close(out[0], dense, atol=1e-5, rtol=0)


def test_bfloat16_caches() -> None:
    batch = make_decode_batch(9, 3, 64, 16, [20, 33, 7], dtype=torch.bfloat16)
    out = decode(paged_decode_attention, batch)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference(batch).float(), atol=2e-2, rtol=0)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_compiled_matches_reference_without_recompiling(one_torch_thread: None, impl) -> None:
    """One torch.compile (batch and block-table width dynamic, as in engine/compiled_decode.py)
    serves every batch size >= 2 and context length of the SmolLM2 head layout."""
    if impl is cpu_kernel:   # the dispatcher, traced with the library loaded, calls the kernel
        load_common_ops()
        impl = paged_decode_attention
    compiled = torch.compile(impl, fullgraph=True, dynamic=False)

    def run(batch: dict) -> torch.Tensor:
        for tensor in (batch["q"], batch["block_tables"], batch["seq_lens"]):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
        torch._dynamo.maybe_mark_dynamic(batch["block_tables"], 1)
        torch._dynamo.maybe_mark_dynamic(batch["k_cache"], 0)
        torch._dynamo.maybe_mark_dynamic(batch["v_cache"], 0)
        return decode(compiled, batch)

    with torch.inference_mode():             # as the engine's steps: guards include the dispatch keys
        first = make_decode_batch(9, 3, 64, 16, [3, 18, 40])
        torch.testing.assert_close(run(first), reference(first), atol=1e-5, rtol=0)
        with torch.compiler.set_stance("fail_on_recompile"):
            for seed, seq_lens in enumerate([[1, 15, 16, 17, 31, 32, 33, 100], [250, 2], [64] * 32]):
                batch = make_decode_batch(9, 3, 64, 16, seq_lens, extra_columns=seed, seed=seed)
                torch.testing.assert_close(run(batch), reference(batch), atol=1e-5, rtol=0)


@NEEDS_KERNEL
def test_the_dispatcher_takes_the_kernel_for_float32_and_the_reduction_for_bf16() -> None:
    load_common_ops()
    batch = make_decode_batch(9, 3, 64, 16, [20, 33, 7])
    assert torch.equal(decode(paged_decode_attention, batch), decode(cpu_kernel, batch))
    half = make_decode_batch(9, 3, 64, 16, [20, 33, 7], dtype=torch.bfloat16)
    assert torch.equal(decode(paged_decode_attention, half), decode(paged_decode_reduction, half))


@NEEDS_KERNEL
def test_the_kernel_refuses_a_context_past_its_table_or_a_missing_block() -> None:
    batch = make_decode_batch(9, 3, 64, 16, [20, 33])
    batch["seq_lens"] = torch.tensor([20, 33 + 16 * batch["block_tables"].shape[1]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="seq_lens out of the table's range"):
        decode(cpu_kernel, batch)
    batch = make_decode_batch(9, 3, 64, 16, [20, 33])
    batch["block_tables"][1, 1] = -1
    with pytest.raises(RuntimeError, match="a block the context needs is not in the cache"):
        decode(cpu_kernel, batch)


def test_write_kv_scratch_sends_skipped_rows_to_the_last_slot() -> None:
    k_cache = torch.zeros(4, 4, 2, 8)
    v_cache = torch.zeros(4, 4, 2, 8)
    k, v = torch.randn(4, 2, 8), torch.randn(4, 2, 8)
    slots = torch.tensor([5, -1, 11, 0])
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_ref(k, v, k_ref, v_ref, slots)
    write_kv_scratch(k, v, k_cache, v_cache, slots)
    owned = slice(0, 3)                      # blocks 0-2; block 3 is the scratch block
    assert torch.equal(k_cache[owned], k_ref[owned]) and torch.equal(v_cache[owned], v_ref[owned])
    assert torch.equal(k_cache.view(-1, 2, 8)[-1], k[1]) and torch.equal(v_cache.view(-1, 2, 8)[-1], v[1])
    assert int((k_cache[3].abs().sum(dim=(1, 2)) > 0).sum()) == 1   # nothing else in the scratch block


@NEEDS_KERNEL
def test_a_split_sequence_gives_the_same_bits_alone_and_in_any_batch() -> None:
    """How the kernel splits a sequence's keys between tasks depends on its own length only, so a
    row's output is the same alone, in a batch and on one thread."""
    batch = make_decode_batch(9, 3, 64, 16, [1500, 40, 700], seed=3)
    together = decode(cpu_kernel, batch)
    for i in range(3):
        alone = {**batch, "q": batch["q"][i:i + 1], "block_tables": batch["block_tables"][i:i + 1],
                 "seq_lens": batch["seq_lens"][i:i + 1]}
        assert torch.equal(decode(cpu_kernel, alone)[0], together[i])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(decode(cpu_kernel, batch), together)
    finally:
        torch.set_num_threads(threads)

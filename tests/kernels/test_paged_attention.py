"""paged_attention / write_kv: the torch reference against dense causal attention, and the Triton
kernels against the reference (under TRITON_INTERPRET=1 on CPU, natively on CUDA when present).

Tolerances: float32 outputs within 2e-5 of the float64 dense result; bfloat16 caches within 2e-2.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.cpu_ops import cpu_supports_common_ops, load_common_ops
from kernels.triton_runtime import triton_installed
from kernels.paged_attention import paged_attention, paged_attention_ref, write_kv, write_kv_ref

ROOT = Path(__file__).resolve().parents[2]

# (num_heads, num_kv_heads, head_dim, block_size, [(context_len, query_len), ...], num_decodes)
CASES = {
    "batch1_prefill": (4, 4, 16, 4, [(0, 7)], 0),
    "batch1_decode": (4, 2, 16, 4, [(9, 1)], 1),
    "mixed_gqa": (8, 2, 16, 4, [(5, 1), (12, 1), (3, 1), (6, 5), (0, 9), (11, 2)], 3),
    "odd_group_dim": (6, 2, 24, 8, [(17, 1), (0, 3), (9, 1)], 1),  # last: a 1-token prefill chunk
    "one_block_seqs": (2, 1, 8, 16, [(2, 1), (0, 16), (15, 1)], 1),
}


def make_case(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> dict:
    """Random K/V for every sequence scattered into shuffled cache blocks, plus the matching
    metadata; `dense_k`/`dense_v` keep each sequence's keys and values in order."""
    num_heads, num_kv_heads, head_dim, block_size, seqs, num_decodes = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    query_lens = [q for _, q in seqs]
    seq_lens = [c + q for c, q in seqs]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen)  # garbage in unused slots must never be read
    v_cache = torch.randn(shape, generator=gen)
    block_tables = torch.full((len(seqs), max(blocks_per_seq) + 1), -1, dtype=torch.int32)
    dense_k, dense_v = [], []
    for i, seq_len in enumerate(seq_lens):
        table = [order.pop() for _ in range(blocks_per_seq[i])]
        block_tables[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        keys = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
        values = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen)
        for pos in range(seq_len):
            k_cache[table[pos // block_size], pos % block_size] = keys[pos]
            v_cache[table[pos // block_size], pos % block_size] = values[pos]
        dense_k.append(keys)
        dense_v.append(values)
    q = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    to = {"device": device}
    return {
        "q": q.to(dtype=dtype, **to),
        "k_cache": k_cache.to(dtype=dtype, **to),
        "v_cache": v_cache.to(dtype=dtype, **to),
        "block_tables": block_tables.to(**to), "cu_seqlens_q": cu.to(**to),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32, device=device), "query_lens": query_lens,
        "seq_lens_list": seq_lens, "num_decodes": num_decodes, "scale": head_dim**-0.5,
        "dense_k": dense_k, "dense_v": dense_v,
    }


def attention_args(case: dict) -> tuple:
    keys = ("q", "k_cache", "v_cache", "block_tables", "cu_seqlens_q", "seq_lens", "query_lens",
            "seq_lens_list", "num_decodes", "scale")
    return tuple(case[key] for key in keys)


def dense_attention(case: dict) -> torch.Tensor:
    """Plain causal attention in float64 over each sequence's contiguous K/V."""
    q = case["q"].double().cpu()
    out = torch.empty_like(q)
    group = q.shape[1] // case["dense_k"][0].shape[1]
    start = 0
    for keys, values, query_len in zip(case["dense_k"], case["dense_v"], case["query_lens"]):
        seq_len = keys.shape[0]
        keys = keys.double().repeat_interleave(group, dim=1)  # query head h reads KV head h // group
        values = values.double().repeat_interleave(group, dim=1)
        queries = q[start : start + query_len]
        scores = torch.einsum("qhd,khd->hqk", queries, keys) * case["scale"]
        visible = torch.arange(seq_len)[None, :] <= torch.arange(seq_len - query_len, seq_len)[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        out[start : start + query_len] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values)
        start += query_len
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_dense_attention(name: str) -> None:
    case = make_case(name)
    out = paged_attention_ref(*attention_args(case))
    assert out.shape == case["q"].shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), dense_attention(case), atol=2e-5, rtol=0)


@pytest.mark.skipif(not cpu_supports_common_ops(),
                    reason="this CPU has neither AVX512-VNNI nor AVX2 and FMA for the C++ decode attention")
@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_dispatch_sends_decodes_to_the_kernel_and_matches_dense_attention(name: str) -> None:
    """`paged_attention` on CPU: the decodes through the C++ decode kernel, the prefills as the
    reference runs them, together the dense result (odd_group_dim's head_dim 24 stays on the reference)."""
    load_common_ops()
    case = make_case(name)
    out = paged_attention(*attention_args(case))
    torch.testing.assert_close(out.double(), dense_attention(case), atol=2e-5, rtol=0)
    num_decodes = case["num_decodes"]
    if num_decodes and case["q"].shape[-1] % 16 == 0:
        kernel = torch.ops.structserve_cpu.paged_decode_attention(
            case["q"][:num_decodes], case["k_cache"], case["v_cache"], case["block_tables"][:num_decodes],
            case["seq_lens"][:num_decodes], case["scale"])
        assert torch.equal(out[:num_decodes], kernel)


def test_reference_bfloat16_caches() -> None:
    case = make_case("mixed_gqa", dtype=torch.bfloat16)
    out = paged_attention(*attention_args(case))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense_attention(case), atol=2e-2, rtol=0)


def test_write_kv_skips_negative_slots() -> None:
    k_cache = torch.zeros(3, 4, 2, 8)
    v_cache = torch.zeros(3, 4, 2, 8)
    k = torch.randn(4, 2, 8)
    v = torch.randn(4, 2, 8)
    slots = torch.tensor([5, -1, 11, 0])
    write_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, 2, 8), v_cache.view(-1, 2, 8)
    for row, slot in ((0, 5), (2, 11), (3, 0)):
        assert torch.equal(flat_k[slot], k[row]) and torch.equal(flat_v[slot], v[row])
    assert int((flat_k.abs().sum(dim=(1, 2)) > 0).sum()) == 3  # nothing else was written
    write_kv_ref(k[:2], v[:2], k_cache, v_cache, torch.tensor([-1, -1]))
    assert int((flat_k.abs().sum(dim=(1, 2)) > 0).sum()) == 3


def run_triton_cases(device: str) -> None:
    """Triton kernels against the reference on every case (raises AssertionError on mismatch)."""
    from kernels.paged_attention import paged_attention_triton, write_kv_triton

    runs = [(name, torch.float32, 1e-5) for name in sorted(CASES)] + [("mixed_gqa", torch.bfloat16, 2e-2)]
    for name, dtype, atol in runs:
        case = make_case(name, dtype=dtype, device=device)
        expected = paged_attention_ref(*attention_args(case))
        got = paged_attention_triton(*attention_args(case))
        torch.testing.assert_close(got.float(), expected.float(), atol=atol, rtol=0)
    k_cache = torch.zeros(4, 4, 3, 24, device=device)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(5, 3, 24, device=device)
    v = torch.randn(5, 3, 24, device=device)
    slots = torch.tensor([3, -1, 15, 0, -1], device=device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    write_kv_ref(k, v, k_ref, v_ref, slots)
    write_kv_triton(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_triton_kernels_match_reference_in_interpreter() -> None:
    if not triton_installed():
        pytest.skip("triton is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, __file__], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "triton interpreter: ok" in result.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_triton_kernels_match_reference_on_cuda() -> None:
    if not triton_installed():
        pytest.skip("triton is not installed")
    run_triton_cases("cuda")


if __name__ == "__main__":  # run by the interpreter test in a fresh process with TRITON_INTERPRET=1
    assert os.environ.get("TRITON_INTERPRET") == "1"
    run_triton_cases("cpu")
    print("triton interpreter: ok")

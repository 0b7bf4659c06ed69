"""lora_shrink / lora_expand: the torch references against a per-token loop, and the Triton
kernels against the references (under TRITON_INTERPRET=1 on CPU, natively on CUDA when present).

Tolerances: float32 within 1e-4 of the float64 per-token result; bfloat16 within 3e-2 relative
to the output scale.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.triton_runtime import triton_installed
from kernels.lora_expand import lora_expand, lora_expand_ref
from kernels.lora_index import lora_token_index
from kernels.lora_shrink import lora_shrink, lora_shrink_ref

ROOT = Path(__file__).resolve().parents[2]

# name: (in_features, out_features, buffer rank, used rank, num_slots, [(slot, query_len), ...])
CASES = {
    "batch1_decode": (32, 48, 8, 8, 2, [(1, 1)]),
    "all_base": (32, 48, 8, 8, 2, [(-1, 3), (-1, 1)]),
    "one_slot_prefill": (40, 24, 16, 16, 1, [(0, 9), (0, 4)]),
    "padded_decodes": (32, 40, 8, 8, 2, [(0, 1), (1, 1), (0, 1), (1, 1), (0, 1), (-1, 1), (1, 1)]),
    "padded_empty_slot": (32, 40, 8, 6, 3, [(0, 1), (2, 1), (0, 1), (2, 1)]),
    "gathered": (32, 40, 8, 8, 2, [(0, 1), (1, 1), (0, 1), (1, 1), (0, 1), (1, 1), (0, 1), (0, 20)]),
    "mixed_decode_prefill": (72, 100, 16, 12, 4, [(2, 1), (-1, 1), (0, 1), (2, 1), (3, 17), (-1, 5), (0, 3)]),
    "empty_slot_rank1": (24, 20, 4, 1, 3, [(2, 2), (0, 1)]),
    "wide_rank_many_tokens": (96, 130, 48, 40, 2, [(1, 70), (0, 33), (-1, 2)]),
}


def make_case(name: str, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0) -> dict:
    """Random activations and stacked A/B (rank narrowed to the used rank by a view), plus the index."""
    in_f, out_f, rank, used_rank, num_slots, seqs = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    num_tokens = sum(n for _, n in seqs)
    a_buf = torch.randn(num_slots, rank, in_f, generator=gen) / in_f**0.5
    b_buf = torch.randn(num_slots, out_f, rank, generator=gen) / rank**0.5
    x = torch.randn(num_tokens, in_f, generator=gen)
    y = torch.randn(num_tokens, out_f, generator=gen)
    index = lora_token_index([s for s, _ in seqs], [n for _, n in seqs], num_slots, torch.device(device))
    to = {"dtype": dtype, "device": device}
    return {
        "x": x.to(**to), "y": y.to(**to), "lora_a": a_buf.to(**to)[:, :used_rank],
        "lora_b": b_buf.to(**to)[:, :, :used_rank], "index": index,
        "token_slots": [s for s, n in seqs for _ in range(n)],
    }


def per_token(case: dict, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(shrink rows in the index's layout, expanded y) computed token by token in float64."""
    x, y = case["x"].double().cpu(), case["y"].double().cpu().clone()
    a, b = case["lora_a"].double().cpu(), case["lora_b"].double().cpu()
    index = case["index"]
    shrunk = torch.zeros(index.num_rows, a.shape[1], dtype=torch.float64)
    row_token = index.row_token_idx.tolist()
    for slot, (start, count) in enumerate(zip(index.slot_start_list, index.slot_count_list)):
        for row in range(start, start + count):
            token = row_token[row]
            assert case["token_slots"][token] == slot
            shrunk[row] = a[slot] @ x[token]
            y[token] += scaling * (b[slot] @ shrunk[row])
    assert sorted(row_token[r] for s, c in zip(index.slot_start_list, index.slot_count_list)
                  for r in range(s, s + c)) == [t for t, slot in enumerate(case["token_slots"]) if slot >= 0]
    return shrunk, y


@pytest.mark.parametrize("name", sorted(CASES))
def test_references_match_per_token_loop(name: str) -> None:
    case = make_case(name)
    expected_s, expected_y = per_token(case, 0.5)
    s = lora_shrink_ref(case["x"], case["lora_a"], case["index"])
    assert s.dtype == torch.float32 and s.shape == expected_s.shape
    torch.testing.assert_close(s.double(), expected_s, atol=1e-4, rtol=0)
    lora_expand_ref(case["y"], s, case["lora_b"], case["index"], 0.5)
    torch.testing.assert_close(case["y"].double(), expected_y, atol=1e-4, rtol=0)


def test_index_groups_tokens_by_slot() -> None:
    cpu = torch.device("cpu")
    index = lora_token_index([2, -1, 0, 2], [1, 2, 3, 2], 4, cpu)       # 4 slots x 3 > 1.5 x 6: compact
    assert index.token_slots.tolist() == [2, -1, -1, 0, 0, 0, 2, 2] and not index.padded
    assert index.row_token_idx.tolist() == [3, 4, 5, 0, 6, 7] and index.num_rows == 6
    assert index.slot_start_list == (0, 3, 3, 6) and index.slot_count.tolist() == [3, 0, 3, 0]
    assert index.max_tokens_per_slot == 3 and index.num_lora_tokens == 6
    assert index.segments == ((0, 3, 6, 0), (2, 0, 1, 3), (2, 6, 8, 4)) and index.contiguous
    assert lora_token_index([0, 0], [2, 1], 1, cpu).segments == ((0, 0, 3, 0),)
    padded = lora_token_index([0, 1, -1, 0, 1], [1, 1, 1, 1, 1], 2, cpu)
    assert padded.padded and padded.row_token_idx.tolist() == [0, 3, 1, 4] and padded.slot_start_list == (0, 2)
    assert padded.row_valid is not None and padded.row_valid.flatten().tolist() == [1, 1, 1, 1]
    gathered = lora_token_index([0, 1, 0, 1, 0, 1, 0], [1, 1, 1, 1, 1, 1, 20], 2, cpu)
    assert not gathered.padded and len(gathered.segments) == 7 and not gathered.contiguous


def test_base_tokens_are_untouched_in_bfloat16() -> None:
    case = make_case("mixed_decode_prefill", dtype=torch.bfloat16)
    before = case["y"].clone()
    _, expected_y = per_token(case, 2.0)
    s = lora_shrink(case["x"], case["lora_a"], case["index"])
    lora_expand(case["y"], s, case["lora_b"], case["index"], 2.0)
    base_rows = [t for t, slot in enumerate(case["token_slots"]) if slot < 0]
    assert torch.equal(case["y"][base_rows], before[base_rows])
    scale = expected_y.abs().max()
    assert (case["y"].double() - expected_y).abs().max() < 3e-2 * scale


def run_triton_cases(device: str) -> None:
    """Triton kernels against the references on every case (raises AssertionError on mismatch)."""
    from kernels.lora_expand import lora_expand_triton
    from kernels.lora_shrink import lora_shrink_triton

    runs = [(name, torch.float32, 1e-4) for name in sorted(CASES)] + [("mixed_decode_prefill", torch.bfloat16, 3e-2)]
    for name, dtype, tol in runs:
        case = make_case(name, dtype=dtype, device=device)
        expected_s = lora_shrink_ref(case["x"], case["lora_a"], case["index"])
        got_s = lora_shrink_triton(case["x"], case["lora_a"], case["index"])
        torch.testing.assert_close(got_s, expected_s, atol=tol, rtol=tol)
        expected_y = case["y"].clone()
        lora_expand_ref(expected_y, expected_s, case["lora_b"], case["index"], 0.75)
        lora_expand_triton(case["y"], expected_s, case["lora_b"], case["index"], 0.75)
        scale = float(expected_y.float().abs().max())
        torch.testing.assert_close(case["y"].float(), expected_y.float(), atol=tol * scale, rtol=0)


def test_triton_kernels_match_reference_in_interpreter() -> None:
    if not triton_installed():
        pytest.skip("triton is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, __file__], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
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
    torch.set_num_threads(1)
    run_triton_cases("cpu")
    print("triton interpreter: ok")

"""apply_bitmask: reference vs a per-token specification, Triton (interpreter on CPU, CUDA if present)
vs reference. Masking is exact, so results must be bit-identical (tolerance 0)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernels.triton_runtime import triton_installed
from kernels.apply_bitmask import apply_bitmask, apply_bitmask_ref

REPO = Path(__file__).resolve().parents[2]
# (num_rows, vocab_size, bitmask width): batch 1, vocab not a multiple of 32, mask narrower than vocab.
SHAPES = [(1, 1, 1), (1, 33, 2), (3, 100, 4), (2, 64, 2), (2, 70, 2), (4, 1030, 33)]


def make_case(num_rows: int, vocab_size: int, width: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_rows, vocab_size, generator=gen)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (num_rows, width), generator=gen, dtype=torch.int64).to(torch.int32)
    bitmask[0] = -1  # an all-allowed row
    if num_rows > 2:
        bitmask[1] = 0  # an all-disallowed row
    return logits, bitmask


def spec_apply(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Per-token definition of the op, for tiny shapes."""
    out = logits.clone()
    for r in rows:
        for t in range(logits.shape[1]):
            word = t // 32
            allowed = word < bitmask.shape[1] and (int(bitmask[r, word]) >> (t % 32)) & 1
            if not allowed:
                out[r, t] = float("-inf")
    return out


def shift_unpack_apply(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """The former reference (32 shifts into a bool mask, then masked_fill_), kept to compare the
    table-lookup reference against on full-size vocabularies."""
    num_rows, vocab_size = logits.shape
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).reshape(num_rows, -1).bool()
    if allowed.shape[1] >= vocab_size:
        allowed = allowed[:, :vocab_size]
    else:
        allowed = torch.cat([allowed, torch.zeros(num_rows, vocab_size - allowed.shape[1], dtype=torch.bool)], 1)
    logits.masked_fill_(~allowed, float("-inf"))


@pytest.mark.parametrize("shape", SHAPES)
def test_ref_matches_spec(shape):
    logits, bitmask = make_case(*shape)
    expected = spec_apply(logits, bitmask, list(range(shape[0])))
    apply_bitmask_ref(logits, bitmask)
    assert torch.equal(logits, expected)


@pytest.mark.parametrize("shape", [(32, 49152, 1536), (5, 49155, 1537), (3, 1000, 30), (2, 151936, 4748)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ref_matches_the_shift_unpacking_on_full_vocabularies(shape, dtype):
    logits, bitmask = make_case(*shape)
    logits = logits.to(dtype)
    logits[0, :3] = float("-inf")             # already-masked logits stay -inf either way
    expected = logits.clone()
    shift_unpack_apply(expected, bitmask)
    apply_bitmask_ref(logits, bitmask)
    assert torch.equal(logits, expected)
    some = torch.tensor([shape[0] - 1, 0])
    logits, bitmask = make_case(*shape, seed=1)
    expected = logits.clone()
    selected = expected[some]
    shift_unpack_apply(selected, bitmask[some])
    expected[some] = selected
    apply_bitmask_ref(logits, bitmask, some)
    assert torch.equal(logits, expected)


def test_ref_row_indices_only_touch_those_rows():
    logits, bitmask = make_case(4, 100, 4)
    expected = spec_apply(logits, bitmask, [1, 3])
    apply_bitmask_ref(logits, bitmask, torch.tensor([3, 1]))
    assert torch.equal(logits, expected)
    before = logits.clone()
    apply_bitmask_ref(logits, bitmask, torch.tensor([], dtype=torch.long))
    assert torch.equal(logits, before)


def test_dispatcher_on_cpu_and_errors():
    logits, bitmask = make_case(3, 100, 4)
    expected = logits.clone()
    apply_bitmask_ref(expected, bitmask)
    apply_bitmask(logits, bitmask)
    assert torch.equal(logits, expected)
    with pytest.raises(ValueError):
        apply_bitmask(logits, bitmask[:2])
    with pytest.raises(ValueError):
        apply_bitmask(logits, bitmask.to(torch.int64))


TRITON_SCRIPT = textwrap.dedent(
    """
    import torch
    from kernels.apply_bitmask import apply_bitmask_ref, apply_bitmask_triton
    shapes = {shapes!r}
    for i, (n, v, w) in enumerate(shapes):
        g = torch.Generator().manual_seed(i)
        logits = torch.randn(n, v, generator=g)
        mask = torch.randint(-2**31, 2**31 - 1, (n, w), generator=g, dtype=torch.int64).to(torch.int32)
        mask[0] = -1
        for idx in (None, torch.tensor([n - 1])):
            a, b = logits.clone(), logits.clone()
            apply_bitmask_ref(a, mask, idx)
            apply_bitmask_triton(b, mask, idx)
            assert torch.equal(a, b), (n, v, w, idx)
    print("TRITON_OK", len(shapes))
    """
)


def test_triton_kernel_under_interpreter():
    if not triton_installed():
        pytest.skip("triton is not installed")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", TRITON_SCRIPT.format(shapes=SHAPES[:5])], env=env, cwd=REPO, check=False,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TRITON_OK 5" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", [*SHAPES, (256, 152064, 4752), (1, 49152, 1536)])
def test_triton_matches_ref_on_cuda(shape):
    from kernels.apply_bitmask import apply_bitmask_triton

    logits, bitmask = make_case(*shape)
    expected = logits.clone()
    apply_bitmask_ref(expected, bitmask)
    out = logits.cuda()
    apply_bitmask_triton(out, bitmask.pin_memory())
    assert torch.equal(out.cpu(), expected)
    idx = torch.tensor([shape[0] - 1], device="cuda")
    expected, out = logits.clone(), logits.cuda()
    apply_bitmask_ref(expected, bitmask, idx.cpu())
    apply_bitmask_triton(out, bitmask.cuda(), idx)
    assert torch.equal(out.cpu(), expected)

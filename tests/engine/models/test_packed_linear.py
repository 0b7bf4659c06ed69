"""engine/models/packed_linear.py: the oneDNN-packed product equals F.linear; other dtypes fall back."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.packed_linear import linear, prepack_weight
from tests.engine.tiny_engine import load_tiny


@pytest.mark.parametrize("num_rows", [0, 1, 7, 32, 33, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_equals_dense(num_rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(96, 40, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    x = torch.randn(num_rows, 40, generator=gen)
    packed = prepack_weight(weight)
    assert (packed is not None) == torch.backends.mkldnn.is_available()   # the pinned CPU build has oneDNN
    out = linear(x, weight, bias, packed)
    assert out.shape == (num_rows, 96) and out.dtype == torch.float32
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_strided_and_batched_inputs() -> None:
    weight = torch.randn(24, 16)
    packed = prepack_weight(weight)
    wide = torch.randn(5, 32)[:, :16]          # a column slice, as after a fused split
    torch.testing.assert_close(linear(wide, weight, None, packed), F.linear(wide, weight))
    cube = torch.randn(2, 3, 16)
    torch.testing.assert_close(linear(cube, weight, None, packed), F.linear(cube, weight))


def test_other_dtypes_use_the_dense_path() -> None:
    weight = torch.randn(8, 4, dtype=torch.bfloat16)
    assert prepack_weight(weight) is None
    x = torch.randn(3, 4, dtype=torch.bfloat16)
    torch.testing.assert_close(linear(x, weight, None, None), F.linear(x, weight))


def test_model_forward_uses_packed_weights_after_load(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    model, _ = load_tiny(tiny_model_dir)
    layer = model.layers[0]
    assert all(packed is not None for _, _, packed in layer._projections.values())
    assert model._packed_lm_head is not None
    hidden = torch.randn(4, model.arch.hidden_size)
    torch.testing.assert_close(model.compute_logits(hidden), F.linear(hidden, model.lm_head), rtol=1e-5, atol=1e-5)

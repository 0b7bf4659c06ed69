"""Linear layers on CPU through oneDNN with weights reordered once at load time.

Why: for a decode batch (tens of rows against a weight of hundreds to tens of thousands of rows),
`F.linear` on CPU goes to MKL's sgemm, which repacks the weight on every call and, on this project's
2-core machine, gains nothing from a second thread. oneDNN's inner-product primitive over a weight
reordered to its blocked layout ahead of time runs the same float32 products about 1.5x faster on
one thread and scales to two (measured on SmolLM2-135M's shapes at 32 rows: 147 ms -> 95 ms for all
121 projections of one decode step, 2 threads). The reorder is `torch.ops.mkldnn._reorder_linear_weight`
and the product `torch.ops.mkldnn._linear_pointwise`, the pair PyTorch's own inductor emits for
frozen CPU linears; results match `F.linear` to float32 rounding (sums are reordered).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Rows the reorder is tuned for; any row count works with the packed weight (decode steps of a few
# dozen sequences are the case that matters for throughput).
PACK_BATCH_HINT = 32


def prepack_weight(weight: torch.Tensor, batch_hint: int = PACK_BATCH_HINT) -> torch.Tensor | None:
    """oneDNN-blocked copy of `weight` `[out_features, in_features]`, or None where the dense path
    is used instead: off CPU, dtype other than float32, or a PyTorch build without oneDNN.
    The copy costs the weight's size again in host memory (bytes = 4 * out * in)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), batch_hint)


def linear(
    x: torch.Tensor,  # [..., in_features]
    weight: torch.Tensor,  # [out_features, in_features]
    bias: torch.Tensor | None,  # [out_features] or None
    packed: torch.Tensor | None,  # prepack_weight(weight) or None
) -> torch.Tensor:
    """`x @ weight.T + bias` as `[..., out_features]` in x's dtype, through the packed copy when there
    is one. `packed` must have been made from `weight`'s current values."""
    if packed is None:
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")

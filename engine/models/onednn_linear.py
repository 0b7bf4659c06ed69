"""The oneDNN product over a weight reordered once at load (`torch.ops.mkldnn._reorder_linear_weight`),
as an operator torch.compile can take as a graph input.

Why an operator of our own: a reordered weight is an opaque MKLDNN-layout tensor. Eager,
`torch.ops.mkldnn._linear_pointwise` multiplies by it directly. Compiled, inductor lowers
`_linear_pointwise` only when the weight is a constant of the graph (`freezing`), and a graph with
MKLDNN constants is refused by inductor's FX graph cache ("mkldnn tensors unpickleable") while
AOTAutograd's cache refuses every frozen graph (torch 2.13). Wrapped in a custom operator
(`torch.library.custom_op`, "structserve::onednn_linear") with a fake implementation that gives
the output's shape, the product stays one opaque call in the graph, the reordered weight is a
graph input like any other buffer, and both on-disk caches can hold the compiled decode step
(engine/compiled_decode.py). Importing this module registers the operator (once per process).
"""

from __future__ import annotations

import torch


@torch.library.custom_op("structserve::onednn_linear", mutates_args=())
def _onednn_linear_op(x: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, None, "none", [None], "")


@_onednn_linear_op.register_fake
def _onednn_linear_fake(x: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))


def onednn_linear(x: torch.Tensor, packed_weight: torch.Tensor, out_features: int) -> torch.Tensor:
    """`x @ W.T` without bias, `[num_tokens, in_features]` -> `[num_tokens, out_features]` in x's
    dtype (bf16 or float32, the dtype `packed_weight` was reordered in).

    `packed_weight`: `W` `[out_features, in_features]` reordered by
    `torch.ops.mkldnn._reorder_linear_weight` (MKLDNN layout, CPU). Eager calls oneDNN directly
    (no custom-operator dispatch, ~20 us less per call); under torch.compile the call goes through
    the "structserve::onednn_linear" operator (see the module docstring).
    """
    if torch.compiler.is_compiling():
        return torch.ops.structserve.onednn_linear(x, packed_weight, out_features)
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, None, "none", [None], "")

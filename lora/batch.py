"""One step's LoRA: per-token slots plus the stacked weights, applied inside the model's projections.

The model calls `apply(layer, projection, x, y)` right after each fused projection `y = x @ Wᵀ`;
it adds `x @ A[slot]ᵀ @ B[slot]ᵀ` (scaling already in B) to every token's row with one shrink and
one expand over all the step's adapters (kernels/lora_shrink.py, kernels/lora_expand.py), and
returns at once for projections that no adapter in the step touches.

CPU path choice (SmolLM2 projections of one layer, 32 decode tokens, rank 16 on all modules,
1 thread; base projections 6.5 ms): one adapter 0.66 ms; four adapters 0.78 ms with one batched
matmul over slots (padded layout), 1.6 ms with one matmul per slot, 1.7 ms with a gather per slot;
one masked matmul over all slots costs about as much as a matmul per slot at 32 tokens and 3x
more at 512; a per-token gather of A and B (bmm) was 12-240 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.lora_expand import lora_expand
from kernels.lora_index import LoraTokenIndex
from kernels.lora_shrink import lora_shrink
from lora.slots import LoraSlotBuffers


@dataclass(frozen=True, slots=True)
class LoraBatch:
    """The LoRA inputs of one forward.

    index: which slot each token uses (kernels/lora_index.py); `index.num_slots` is one past the
        highest slot in the step, so only that many buffer slots are read.
    widths: projection -> rank columns used by the step's adapters; a projection that is absent
        gets no LoRA this step.
    """

    index: LoraTokenIndex
    buffers: LoraSlotBuffers
    widths: dict[str, int]

    def apply(
        self,
        layer: int,
        projection: str,
        x: torch.Tensor,  # [num_tokens, in_features], the projection's input
        y: torch.Tensor,  # [num_tokens, out_features], the projection's output, updated in place
    ) -> None:
        """Add the LoRA delta of `projection` in `layer` to `y` for every token with an adapter."""
        width = self.widths.get(projection, 0)
        if width == 0:
            return
        num_slots = self.index.num_slots
        lora_a = self.buffers.lora_a[layer][projection][:num_slots, :width]
        lora_b = self.buffers.lora_b[layer][projection][:num_slots, :, :width]
        lora_expand(y, lora_shrink(x, lora_a, self.index), lora_b, self.index)

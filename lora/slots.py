"""The stacked LoRA weights of the resident adapters, one slot per adapter, on the model device.

Per layer and fused projection (`qkv`, `o`, `gate_up`, `down`): `lora_a` `[max_loras, width,
in_features]` and `lora_b` `[max_loras, out_features, width]` in the model dtype, where width =
(modules in the projection) * max_lora_rank. A slot packs its adapter's modules side by side in
the rank columns (lora/adapter.py `layer_layout`); everything else in the slot is zero, so one
shrink + one expand per projection serves any mix of adapters and modules.
"""

from __future__ import annotations

import torch

from lora.adapter import LoraAdapter
from lora.targets import LoraModelSpec


class LoraSlotBuffers:
    """Owns the stacked A/B buffers; `write` fills a slot with an adapter (engine thread only).

    `slot_widths[slot][projection]` is the number of rank columns the slot's adapter uses there
    (0 or absent: the adapter leaves that projection alone).
    """

    def __init__(self, spec: LoraModelSpec, max_loras: int, max_lora_rank: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.spec = spec
        self.max_loras = max_loras
        self.lora_a: list[dict[str, torch.Tensor]] = []
        self.lora_b: list[dict[str, torch.Tensor]] = []
        projections = spec.projection_modules()
        for _ in range(spec.num_layers):
            a_layer, b_layer = {}, {}
            for projection, modules in projections.items():
                in_features, out_features = spec.projection_shape(projection)
                width = len(modules) * max_lora_rank
                a_layer[projection] = torch.zeros(max_loras, width, in_features, dtype=dtype, device=device)
                b_layer[projection] = torch.zeros(max_loras, out_features, width, dtype=dtype, device=device)
            self.lora_a.append(a_layer)
            self.lora_b.append(b_layer)
        self.slot_widths: list[dict[str, int]] = [{} for _ in range(max_loras)]

    @property
    def num_bytes(self) -> int:
        """Device memory of all buffers."""
        return sum(t.nbytes for layer in self.lora_a + self.lora_b for t in layer.values())

    @torch.no_grad()
    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Replace slot `slot`'s weights with `adapter`'s (host -> device copies, cast to the
        buffer dtype). The caller guarantees no scheduled step still reads the slot."""
        spec = self.spec
        widths: dict[str, int] = {}
        for layer in range(spec.num_layers):
            for projection, a_buf in self.lora_a[layer].items():
                b_buf = self.lora_b[layer][projection]
                a_buf[slot].zero_()
                b_buf[slot].zero_()
                for offset, row, lora_a, lora_b in adapter.layer_layout(spec, layer, projection):
                    rank, rows = lora_a.shape[0], lora_b.shape[0]
                    a_buf[slot, offset:offset + rank].copy_(lora_a)
                    b_buf[slot, row:row + rows, offset:offset + rank].copy_(lora_b)
                    widths[projection] = max(widths.get(projection, 0), offset + rank)
        self.slot_widths[slot] = widths

    def clear(self, slot: int) -> None:
        """Forget which adapter the slot held (its weights stay until the next `write`)."""
        self.slot_widths[slot] = {}


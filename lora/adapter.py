"""A loaded LoRA adapter in host memory, and where its modules go in the fused projections."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lora.targets import LoraModelSpec


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    """A validated PEFT LoRA adapter, float32 on the CPU.

    weights[(layer, module)] = (lora_a `[rank, in_features]`, lora_b `[out_features, rank]`), with
    the module's scaling (alpha / rank, or alpha / sqrt(rank) with rsLoRA) already multiplied into
    lora_b, so the delta of a module is `x @ lora_aᵀ @ lora_bᵀ`. `rank` is the largest module rank.
    """

    path: str
    rank: int
    lora_alpha: float
    use_rslora: bool
    modules: frozenset[str]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def num_bytes(self) -> int:
        """Host memory held by the weights."""
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())

    def projections(self, spec: LoraModelSpec) -> frozenset[str]:
        """Fused projections this adapter changes."""
        return frozenset(spec.targets[m].projection for m in self.modules)

    def layer_layout(
        self, spec: LoraModelSpec, layer: int, projection: str
    ) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """(rank column offset, output row offset, lora_a, lora_b) of each module of `projection`
        in `layer` that the adapter targets, packed: the first module's ranks start at column 0,
        the next one's right after; rows are the module's place in the fused output."""
        out: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []
        offset = 0
        for target in spec.projection_modules()[projection]:
            pair = self.weights.get((layer, target.module))
            if pair is not None:
                out.append((offset, target.out_offset, pair[0], pair[1]))
                offset += pair[0].shape[0]
        return out

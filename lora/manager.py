"""LoraManager: loaded adapters (registry), resident slots, and each step's LoraBatch.

Residency rules (engine thread): a sequence holds a slot reference while it is RUNNING
(`acquire_slot` at admission, `release_slot` at preemption or finish), so a slot in use is never
rewritten. A sequence whose adapter is not resident takes a free slot, else the least recently
used slot nobody holds (unloaded adapters first). When every slot is held, it waits, and at the
end of that admission pass (`end_admission`) the slot with the fewest holders is marked
draining: no new sequence joins it, so the waiting one gets it once its holders finish (no
starvation behind popular adapters). Draining starts only after the pass so that every queued
sequence of a resident adapter joins its slot first: with one slot and a queue alternating two
adapters, draining at the first refusal let one sequence run at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import torch

from kernels.lora_index import lora_token_index
from lora.adapter import LoraAdapter
from lora.batch import LoraBatch
from lora.config import LoraConfig
from lora.peft_loader import load_peft_adapter
from lora.registry import LoraRegistry
from lora.slots import LoraSlotBuffers
from lora.targets import LoraModelSpec

logger = logging.getLogger(__name__)


class LoraManager:
    """Adapters for one base model: `registry` (names, host weights, users; thread-safe) and the
    device slots (engine thread only). Loads `config.modules` at construction; raises
    InvalidLoraAdapter when one of them is bad."""

    def __init__(self, config: LoraConfig, spec: LoraModelSpec, dtype: torch.dtype, device: torch.device,
                 read: Callable[[str], LoraAdapter] | None = None) -> None:
        self.config = config
        self.spec = spec
        self.registry = LoraRegistry(
            read or partial(load_peft_adapter, spec=spec, max_lora_rank=config.max_lora_rank),
            config.max_cpu_loras)
        self.buffers = LoraSlotBuffers(spec, config.max_loras, config.max_lora_rank, dtype, device)
        self.device = device
        num = config.max_loras
        self._slot_adapter: list[int] = [0] * num        # adapter_id in each slot, 0 = empty
        self._slot_refs: list[int] = [0] * num           # running sequences holding each slot
        self._slot_last_used: list[int] = [0] * num
        self._slot_of: dict[int, int] = {}
        self._draining: int | None = None
        self._drain_wanted = False                      # a sequence was refused a slot this pass
        self._clock = 0
        self.num_slot_loads = 0
        for module in config.modules:
            self.registry.load(module.name, module.path, module.base_model_name)
        logger.info("LoRA: %d slots of rank <= %d (%.1f MiB), %d adapters loaded", num, config.max_lora_rank,
                    self.buffers.num_bytes / 2**20, len(config.modules))

    def begin_request(self, name: str, num_seqs: int) -> int:
        """Count `num_seqs` new sequences on adapter `name` (its host weights stay until they
        end); returns its adapter_id. Raises LoraAdapterNotFound, or InvalidLoraAdapter when the
        adapter had left host memory and its folder no longer reads."""
        return self.registry.pin(name, num_seqs)

    def end_sequence(self, adapter_id: int) -> None:
        """One sequence of `adapter_id` finished (an unloaded adapter is freed after its last)."""
        self.registry.unpin(adapter_id)

    @property
    def slot_refs(self) -> tuple[int, ...]:
        """Running sequences holding each slot."""
        return tuple(self._slot_refs)

    @property
    def num_resident_adapters(self) -> int:
        """Adapters whose weights are in a device slot now (held or idle)."""
        return len(self._slot_of)

    def slot_of(self, adapter_id: int) -> int:
        """The slot holding `adapter_id`, -1 for the base model (0) or a non-resident adapter."""
        return self._slot_of.get(adapter_id, -1)

    def acquire_slot(self, adapter_id: int) -> bool:
        """Take a slot reference for one sequence of the pinned adapter `adapter_id`, loading it
        into a slot first when needed. False when it must wait; then, if every slot is held, a
        slot starts draining at the end of this admission pass (see `end_admission`)."""
        self._clock += 1
        slot = self._slot_of.get(adapter_id)
        if slot is not None:
            if slot == self._draining and self._slot_refs[slot] > 0:
                return False
            if slot == self._draining:
                self._draining = None
        else:
            slot = self._free_slot()
            if slot is None:
                self._drain_wanted = True
                return False
            self._load(slot, adapter_id)
        self._slot_refs[slot] += 1
        self._slot_last_used[slot] = self._clock
        return True

    def end_admission(self) -> None:
        """The scheduler's pass over the waiting queue is over: if a sequence was refused a slot
        because every slot is held, and none drains yet, the slot with the fewest holders starts
        draining (see the module doc)."""
        if self._drain_wanted and self._draining is None:
            self._draining = min(range(len(self._slot_refs)), key=lambda s: self._slot_refs[s])
        self._drain_wanted = False

    def release_slot(self, adapter_id: int) -> None:
        """Drop one sequence's slot reference (preemption or finish)."""
        slot = self._slot_of[adapter_id]
        self._slot_refs[slot] -= 1
        assert self._slot_refs[slot] >= 0

    def prepare_batch(self, seq_slots: list[int], query_lens: list[int]) -> LoraBatch | None:
        """The step's LoraBatch for sequences using `seq_slots` (-1 = base) with `query_lens`
        tokens each; None when no sequence uses an adapter."""
        active = sorted({s for s in seq_slots if s >= 0})
        if not active:
            return None
        widths: dict[str, int] = {}
        for slot in active:
            for projection, width in self.buffers.slot_widths[slot].items():
                widths[projection] = max(widths.get(projection, 0), width)
        index = lora_token_index(seq_slots, query_lens, active[-1] + 1, self.device)
        return LoraBatch(index, self.buffers, widths)

    def _free_slot(self) -> int | None:
        """An empty slot, else the idle slot to evict (unloaded adapters, then least recently used)."""
        idle = [s for s, refs in enumerate(self._slot_refs) if refs == 0]
        if not idle:
            return None
        empty = [s for s in idle if self._slot_adapter[s] == 0]
        if empty:
            return empty[0]
        registry = self.registry
        return min(idle, key=lambda s: (registry.is_live(self._slot_adapter[s]), self._slot_last_used[s]))

    def _load(self, slot: int, adapter_id: int) -> None:
        old = self._slot_adapter[slot]
        if old:
            del self._slot_of[old]
        if self._draining == slot:
            self._draining = None
        self.buffers.write(slot, self.registry.weights(adapter_id))
        self._slot_adapter[slot] = adapter_id
        self._slot_of[adapter_id] = slot
        self.num_slot_loads += 1
        logger.debug("LoRA adapter %d loaded into slot %d (evicted %d)", adapter_id, slot, old)

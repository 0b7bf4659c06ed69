"""Which LoRA slot each token of a step uses, grouped by slot for the shrink/expand kernels.

A step's tokens carry `token_slots` (int32 `[num_tokens]`, -1 = base model). The kernels work
SGMV-style on rows grouped by slot: slot `s` owns rows `slot_start[s] : slot_start[s] +
slot_count[s]` of the shrink output, and `row_token_idx[row]` names the token of each row. Two
layouts, chosen per step:

- compact: rows are the LoRA tokens slot by slot, no gaps (`num_rows` = LoRA tokens);
- padded: every slot gets `max_tokens_per_slot` rows (`num_rows` = num_slots * that), the unused
  rows are padding (their shrink output is zero). Picked when the slots have similar token counts
  (a decode-heavy step): the CPU path then runs one batched matmul over all slots, measured 2x
  faster than one matmul per slot (SmolLM2, 32 decodes over 4 adapters, rank 16, all modules:
  0.78 ms vs 1.6 ms per layer; base projections 6.5 ms).

The index is built once per step and shared by every layer and projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PADDED_MAX_WASTE = 1.5   # padded layout when num_slots * max_tokens_per_slot <= this * LoRA tokens


@dataclass(frozen=True, slots=True)
class LoraTokenIndex:
    """Per-step token -> slot grouping: device tensors plus the host-side numbers.

    token_slots: int32 `[num_tokens]`, -1 = no adapter.
    row_token_idx: int64 `[num_rows]`, the token of each shrink-output row (padding rows: 0).
    slot_start, slot_count: int32 `[num_slots]`; slot `s` owns rows
        `slot_start[s] : slot_start[s] + slot_count[s]`, its tokens in token order.
    row_valid: float32 `[num_rows, 1]`, 1 for real rows, 0 for padding (padded layout, unless
        `row_offset` is set).
    slot_start_list, slot_count_list: the same numbers as Python ints.
    segments: maximal runs of consecutive tokens of one slot as (slot, token_start, token_end,
        row_start), compact layout only; with the batch ordered by slot (the scheduler does so)
        there are at most two per slot and the CPU path slices instead of gathering.
    num_tokens: rows of the activations (`x`, `y`); num_rows: rows of the shrink output.
    padded: which layout; max_tokens_per_slot: largest slot_count (sizes the Triton grid).
    row_offset: `t0` when row `r` is token `t0 + r` for every row (padded layout without padding
        rows, tokens ordered by slot: a balanced decode batch); the CPU path then reads and
        writes `x`/`y` views with no gather or scatter. None otherwise.
    """

    token_slots: torch.Tensor
    row_token_idx: torch.Tensor
    slot_start: torch.Tensor
    slot_count: torch.Tensor
    row_valid: torch.Tensor | None
    slot_start_list: tuple[int, ...]
    slot_count_list: tuple[int, ...]
    segments: tuple[tuple[int, int, int, int], ...]
    num_tokens: int
    num_rows: int
    padded: bool
    max_tokens_per_slot: int
    row_offset: int | None = None

    @property
    def num_slots(self) -> int:
        """Slots the index covers (the leading dimension of the A/B views the kernels read)."""
        return len(self.slot_start_list)

    @property
    def num_lora_tokens(self) -> int:
        """Tokens with an adapter."""
        return sum(self.slot_count_list)

    @property
    def contiguous(self) -> bool:
        """Compact layout with few segments per slot: slicing beats gathering."""
        num_runs = sum(1 for count in self.slot_count_list if count)
        return not self.padded and len(self.segments) <= 2 * num_runs


def lora_token_index(
    seq_slots: list[int],  # slot of each sequence, -1 = base model
    query_lens: list[int],  # tokens of each sequence in this step (same order)
    num_slots: int,  # slots the kernels may read; every slot in seq_slots is < num_slots
    device: torch.device,
) -> LoraTokenIndex:
    """Build the index for a step whose sequence `i` contributes `query_lens[i]` consecutive
    tokens, all using `seq_slots[i]`. Host work is O(num_seqs); a few small copies to `device`."""
    num_tokens = sum(query_lens)
    counts = [0] * num_slots
    pieces: list[tuple[int, int, int]] = []          # (slot, token_start, n), sorted below
    start = 0
    for slot, n in zip(seq_slots, query_lens, strict=True):
        assert -1 <= slot < num_slots, f"slot {slot} out of range"
        if slot >= 0 and n:
            counts[slot] += n
            pieces.append((slot, start, n))
        start += n
    pieces.sort()
    num_lora = sum(counts)
    max_count = max(counts, default=0)
    padded = sum(1 for c in counts if c) > 1 and num_slots * max_count <= PADDED_MAX_WASTE * num_lora
    starts = [s * max_count for s in range(num_slots)] if padded else _exclusive_cumsum(counts)
    segments: list[list[int]] = []
    row_token = [0] * (num_slots * max_count if padded else num_lora)
    filled = list(starts)
    for slot, token, n in pieces:
        row = filled[slot]
        row_token[row:row + n] = range(token, token + n)
        filled[slot] += n
        last = segments[-1] if segments else None
        if last is not None and last[0] == slot and last[2] == token and last[3] + last[2] - last[1] == row:
            last[2] += n
        else:
            segments.append([slot, token, token + n, row])
    row_offset = None
    if padded and row_token and row_token == list(range(row_token[0], row_token[0] + len(row_token))):
        row_offset = row_token[0]      # no padding row either: padding rows point at token 0
    row_valid = None
    if padded and row_offset is None:
        valid = torch.zeros(len(row_token), 1)
        for slot in range(num_slots):
            valid[starts[slot]:starts[slot] + counts[slot]] = 1.0
        row_valid = valid.to(device)
    token_slots = torch.repeat_interleave(
        torch.tensor(seq_slots, dtype=torch.int32), torch.tensor(query_lens, dtype=torch.int64),
        output_size=num_tokens)
    return LoraTokenIndex(
        token_slots=token_slots.to(device),
        row_token_idx=torch.tensor(row_token, dtype=torch.int64).to(device),
        slot_start=torch.tensor(starts, dtype=torch.int32).to(device),
        slot_count=torch.tensor(counts, dtype=torch.int32).to(device),
        row_valid=row_valid,
        slot_start_list=tuple(starts),
        slot_count_list=tuple(counts),
        segments=() if padded else tuple((s, a, b, r) for s, a, b, r in segments),
        num_tokens=num_tokens,
        num_rows=len(row_token),
        padded=padded,
        max_tokens_per_slot=max_count,
        row_offset=row_offset,
    )


def _exclusive_cumsum(counts: list[int]) -> list[int]:
    out, total = [], 0
    for count in counts:
        out.append(total)
        total += count
    return out

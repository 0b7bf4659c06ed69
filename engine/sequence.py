"""Sequence: one generated choice of a request, and its scheduling status."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


class SeqStatus(enum.Enum):
    """Where a sequence is in its life; the FINISHED_* states map to OpenAI finish reasons."""

    WAITING = "waiting"
    WAITING_FOR_GRAMMAR = "waiting_for_grammar"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def is_finished(self) -> bool:
        """True for every FINISHED_* state."""
        return self in FINISH_REASONS


FINISH_REASONS: dict[SeqStatus, str] = {
    SeqStatus.FINISHED_STOPPED: "stop",
    SeqStatus.FINISHED_LENGTH: "length",
    SeqStatus.FINISHED_ABORTED: "abort",
    SeqStatus.FINISHED_ERROR: "error",
}


@dataclass(slots=True)
class Sequence:
    """One choice (`index` in 0..n-1) of request `request_id`.

    Written only by engine/scheduler.py (status, counters) and engine/block_pool.py
    (block_table, block_hashes). `token_ids` = prompt + output tokens; `num_computed_tokens` of
    them have K/V in the cache. `generator` is the per-sequence torch.Generator when seeded.
    """

    seq_id: int
    request_id: str
    index: int
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    arrival_time: float
    lora_name: str | None = None
    adapter_id: int = 0
    cache_salt: str | None = None        # the request's prefix-cache salt (engine/block_hash.py)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    generator: torch.Generator | None = None
    matcher: Any = None                  # constrained.Matcher when the request has a grammar
    stop_reason: str | int | None = None
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        """Prompt + output tokens."""
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens (a copy)."""
        return self.token_ids[self.num_prompt_tokens:]

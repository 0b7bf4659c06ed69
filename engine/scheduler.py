"""Continuous-batching scheduler: decodes first, then chunked prefills, preemption by recompute."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_pool import BlockPool
from engine.sequence import Sequence, SeqStatus
from lora.manager import LoraManager


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Per-step limits: tokens run in one forward, sequences in the batch, tokens per sequence,
    prompt tokens one sequence prefills per step (`long_prefill_token_threshold`, 0 = no cap), and
    prompt tokens past which a step admits no further waiting sequence
    (`max_prefill_tokens_per_step`, 0 = no cap; the first admitted always gets its chunk)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    long_prefill_token_threshold: int = 0
    max_prefill_tokens_per_step: int = 0

    def chunk(self, num_tokens: int, budget: int) -> int:
        """Tokens of a sequence with `num_tokens` uncomputed ones to run within `budget`: never all
        but one (one fewer then), so that a query's last token is not left to a one-token query of
        its own, which on CPU would run the decode attention kernel instead of the prefill kernel
        (other rounding) depending on the budget the step's other requests left
        (tests/engine/test_cache_state_invariance.py)."""
        cap = self.long_prefill_token_threshold
        num = min(num_tokens, budget, cap) if cap > 0 else min(num_tokens, budget)
        return num - 1 if num_tokens - num == 1 and num > 1 else num


@dataclass(slots=True)
class ScheduledSeq:
    """A sequence and the number of its tokens computed this step (the query length)."""

    seq: Sequence
    num_scheduled_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step computes the sequence's last known token, so a new one is sampled."""
        return self.seq.num_computed_tokens + self.num_scheduled_tokens == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    """One step's plan: scheduled sequences (query length 1 first), and those preempted."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens run in this step's forward."""
        return sum(s.num_scheduled_tokens for s in self.scheduled)


class Scheduler:
    """Owns each sequence's status and counters; FCFS with preemption by recompute.

    Each step: running sequences first (decodes and unfinished chunked prefills, in admission
    order), preempting the most recently admitted running sequence when blocks run out; then
    waiting sequences in arrival order (preempted ones at the front), each taking prefix-cache
    hits and then as many prompt tokens as the token budget allows (chunked prefill). A waiting
    sequence whose grammar is compiling, or whose next prompt block is being prefilled right now
    by another running sequence (it waits to reuse it: n choices of one request, many clients
    with one system prompt), is passed over without blocking the others; so is
    one whose LoRA adapter cannot get a slot (`lora`: a RUNNING sequence holds its adapter's slot).

    With `max_prefill_tokens_per_step`, a step stops admitting once its arrivals' prompt tokens
    reach it. Where a forward costs about its token count (CPU), batching prefills saves nothing,
    while each admitted prefill makes the step longer for every sequence in it: N clients arriving
    together with prompts of T ms each all wait N*T in one step, against T, 2T, ... NT in steps
    of one (about half the mean and median TTFT), and the running sequences decode in between.
    SGLang's chunked_prefill_size likewise bounds a batch's new prefill tokens.

    A step that admits a waiting sequence holds back the running sequences' multi-token queries to
    the next step, so the arrival's first forward carries its own prefill and one-token decodes:
    on CPU a step's forward costs about its token count. Held are
    - forced runs (output tokens the grammar appended without sampling, `engine/llm_engine.py`'s
      jump-forward, whose K/V is computed as a multi-token query): no first token waits on them,
      and a tool call's fixed layout forces a run of ~10 tokens every few steps per sequence (at
      concurrency 8 these doubled the arrival's first step);
    - the next chunk of a running prompt with more tokens left to compute than the step's arrivals
      have (shortest first): a cache hit arriving while a cold 1,000-token prompt prefills in
      256-token chunks otherwise waits for one chunk more than the step in progress, while a long
      arrival does not overtake a running long prompt.
    A query is held at most one step in a row, and is scheduled after all when no waiting sequence
    is admitted after all. SGLang likewise runs new prefills ahead of running requests' work
    (prefill-first batches).
    """

    def __init__(self, config: SchedulerConfig, block_pool: BlockPool, lora: LoraManager | None = None) -> None:
        self.config = config
        self.block_pool = block_pool
        self.lora = lora
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._in_flight: dict[bytes, Sequence] = {}   # prompt block digest -> running sequence computing it
        self._held: set[int] = set()      # seq_ids whose forced run the last step held back
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (status WAITING or WAITING_FOR_GRAMMAR)."""
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """True while any sequence is waiting or running."""
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """Plan one step within max_num_batched_tokens and max_num_seqs; allocates KV slots."""
        out = SchedulerOutput()
        held: list[ScheduledSeq] = []
        budget = self._schedule_running(out, self.config.max_num_batched_tokens,
                                        held if self._may_admit() else None)
        admitted_work = 0      # tokens the admitted arrivals have left to compute, this step's included
        if not out.preempted:
            num_running = len(out.scheduled)
            budget = self._schedule_waiting(out, budget)
            admitted_work = sum(item.seq.num_tokens - item.seq.num_computed_tokens
                                for item in out.scheduled[num_running:])
        held = self._schedule_held(out, held, admitted_work)
        self._held = {item.seq.seq_id for item in held}
        out.scheduled.sort(key=self._batch_order)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int, held: list[ScheduledSeq] | None) -> int:
        """Schedule running sequences in admission order, preempting the most recently admitted one
        when blocks run out; with `held` (a list), multi-token queries (forced runs, prompt chunks)
        not held last step go there instead, with the tokens they would have run. A held query
        keeps both: its budget (so holding never changes what the others get) and its KV slots,
        allocated here as if it ran, so an arrival can only take blocks nobody running needs (no
        preemption next step for blocks an arrival took, and a held query can always run after
        all: a step never ends up empty). Returns the budget left."""
        idx = 0
        while idx < len(self.running) and budget > 0:
            seq = self.running[idx]
            num_new = self.config.chunk(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_pool.allocate_slots(seq, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                holds = held is not None and num_new > 1 and seq.seq_id not in self._held
                (held if holds else out.scheduled).append(ScheduledSeq(seq, num_new))
                budget -= num_new
                idx += 1
        return budget

    def _schedule_held(self, out: SchedulerOutput, held: list[ScheduledSeq], admitted_work: int) -> list[ScheduledSeq]:
        """Schedule the held queries (their slots already allocated) that need not yield to this
        step's arrivals (`admitted_work`: the tokens those have left to compute, 0 when none was
        admitted). Returns those still held; they keep their slots for the next step."""
        left: list[ScheduledSeq] = []
        for item in held:
            (left if self._yields(item.seq, admitted_work) else out.scheduled).append(item)
        return left

    @staticmethod
    def _yields(seq: Sequence, admitted_work: int) -> bool:
        """Whether `seq`'s multi-token query waits a step for arrivals with `admitted_work` tokens
        left: always past its prompt (a forced run, or a preempted sequence recomputing its output:
        no first token waits on it), and in its prompt when it has more left than they do."""
        if not admitted_work:
            return False
        left = seq.num_tokens - seq.num_computed_tokens
        return seq.num_computed_tokens >= seq.num_prompt_tokens or left > admitted_work

    def _may_admit(self) -> bool:
        """Whether this step may admit a waiting sequence (a batch slot is free and one is not
        waiting for its grammar); only a hint for holding forced runs, `schedule` checks after."""
        return (len(self.running) < self.config.max_num_seqs
                and any(seq.status is not SeqStatus.WAITING_FOR_GRAMMAR for seq in self.waiting))

    def _batch_order(self, item: ScheduledSeq) -> tuple[bool, int]:
        """Decodes first (paged attention wants them leading), then by LoRA slot, so each
        adapter's tokens are at most two contiguous runs (lora/batch.py slices instead of gathering)."""
        lora = self.lora
        slot = lora.slot_of(item.seq.adapter_id) if lora is not None and item.seq.adapter_id else -1
        return item.num_scheduled_tokens != 1, slot

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        skipped: list[Sequence] = []
        cap, admitted_tokens = self.config.max_prefill_tokens_per_step, 0
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            if cap and admitted_tokens >= cap:
                break
            seq = self.waiting[0]
            if seq.status is SeqStatus.WAITING_FOR_GRAMMAR:
                skipped.append(self.waiting.popleft())
                continue
            cached = self.block_pool.find_cached_prefix(seq) if seq.num_computed_tokens == 0 else []
            if seq.num_computed_tokens == 0 and self._prefix_in_flight(seq, len(cached)):
                skipped.append(self.waiting.popleft())
                continue
            if not self._acquire_adapter(seq):
                skipped.append(self.waiting.popleft())
                continue
            num_cached_tokens = len(cached) * self.block_pool.block_size
            num_new = self.config.chunk(seq.num_tokens - seq.num_computed_tokens - num_cached_tokens, budget)
            if not self.block_pool.allocate_slots(seq, num_new, cached):
                self._release_adapter(seq)
                break
            self.waiting.popleft()
            if seq.status is SeqStatus.WAITING:
                # prompt tokens only: a grammar-forced prefix appended before the first forward
                # (engine/llm_engine.py) is output, although its blocks may hit the cache too
                seq.num_cached_tokens = min(num_cached_tokens, seq.num_prompt_tokens)
                self.block_pool.record_prefix_query(seq.num_prompt_tokens, seq.num_cached_tokens)
            seq.num_computed_tokens += num_cached_tokens
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            self._claim_in_flight(seq, len(cached))
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new
            admitted_tokens += num_new
        self.waiting.extendleft(reversed(skipped))
        if self.lora is not None:
            self.lora.end_admission()
        return budget

    def _prefix_in_flight(self, seq: Sequence, num_hit_blocks: int) -> bool:
        """True when the block right after `seq`'s cache hits is being prefilled by another running
        sequence: waiting a few steps then turns it into a hit (a shared system prompt sent by many
        clients at once, or the n choices of one request, is computed once)."""
        if num_hit_blocks >= len(seq.block_hashes):
            return False
        block_hash = seq.block_hashes[num_hit_blocks]
        owner = self._in_flight.get(block_hash)
        if owner is None or owner is seq:
            return False
        # block hashes chain their parents, so the owner's claimed block sits at the same index; its
        # own `block_hashes` may not reach it (cache_full_blocks keeps only its computed blocks')
        if (owner.status is SeqStatus.RUNNING
                and owner.num_computed_tokens < (num_hit_blocks + 1) * self.block_pool.block_size):
            return True
        del self._in_flight[block_hash]          # stale: finished, preempted or already computed
        return False

    def _claim_in_flight(self, seq: Sequence, num_hit_blocks: int) -> None:
        if self.block_pool.enable_prefix_caching:
            for block_hash in seq.block_hashes[num_hit_blocks:]:
                self._in_flight.setdefault(block_hash, seq)

    def _drop_in_flight(self, seq: Sequence) -> None:
        for block_hash in seq.block_hashes:
            if self._in_flight.get(block_hash) is seq:
                del self._in_flight[block_hash]

    def _acquire_adapter(self, seq: Sequence) -> bool:
        return not seq.adapter_id or self.lora is None or self.lora.acquire_slot(seq.adapter_id)

    def _release_adapter(self, seq: Sequence) -> None:
        if seq.adapter_id and self.lora is not None:
            self.lora.release_slot(seq.adapter_id)

    def _preempt(self, seq: Sequence) -> None:
        self._drop_in_flight(seq)
        self._release_adapter(seq)
        self.block_pool.free_seq(seq)
        seq.num_computed_tokens = 0
        seq.status = SeqStatus.PREEMPTED
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update_after_step(self, out: SchedulerOutput) -> None:
        """Advance num_computed_tokens of every scheduled sequence and cache its full blocks."""
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_scheduled_tokens
            self.block_pool.cache_full_blocks(item.seq)

    def finish(self, seq: Sequence, status: SeqStatus) -> None:
        """End `seq` with a FINISHED_* status, free its blocks and drop it from the queues."""
        assert status.is_finished
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self._release_adapter(seq)
        elif not seq.status.is_finished:
            self.waiting.remove(seq)
        if seq.adapter_id and self.lora is not None and not seq.status.is_finished:
            self.lora.end_sequence(seq.adapter_id)
        seq.status = status
        self._drop_in_flight(seq)
        self.block_pool.free_seq(seq)

    def check_invariants(self) -> None:
        """Assert the block pool invariants against the sequences that hold blocks."""
        holders = [s for s in self.running] + [s for s in self.waiting if s.block_table]
        self.block_pool.check_invariants(holders)
        assert len(self.running) <= self.config.max_num_seqs

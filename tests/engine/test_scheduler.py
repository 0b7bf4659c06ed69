"""Scheduler property tests: random add/step/abort/finish sequences never leak or double-free."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.block_pool import BlockPool
from engine.config import DEFAULT_CPU_PREFILL_TOKENS_PER_STEP, EngineConfig
from engine.errors import InvalidSamplingParams
from engine.llm_engine import _cap
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from engine.sequence import Sequence, SeqStatus


def new_scheduler(num_blocks=12, block_size=4, max_tokens=40, max_seqs=4, caching=True) -> Scheduler:
    pool = BlockPool(num_blocks, block_size, caching)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=max_tokens, max_num_seqs=max_seqs,
                                     max_model_len=num_blocks * block_size), pool)


def make_seq(seq_id: int, prompt: list[int], max_tokens: int) -> Sequence:
    return Sequence(seq_id=seq_id, request_id=f"r{seq_id}", index=0, token_ids=list(prompt),
                    num_prompt_tokens=len(prompt), sampling_params=SamplingParams(max_tokens=max_tokens),
                    arrival_time=float(seq_id))


def fake_step(sched: Scheduler) -> list[Sequence]:
    """Schedule, pretend to run, append token 7 to sampling seqs, finish those at max_tokens."""
    return fake_run(sched, sched.schedule())


def fake_run(sched: Scheduler, out: SchedulerOutput) -> list[Sequence]:
    """Pretend to run the planned step `out` as `fake_step` does; returns the sequences finished."""
    assert out.num_batched_tokens <= sched.config.max_num_batched_tokens
    sampling = [s.seq for s in out.scheduled if s.samples]
    sched.update_after_step(out)
    finished = []
    for seq in sampling:
        seq.token_ids.append(7)
        if seq.num_output_tokens >= seq.sampling_params.max_tokens:
            sched.finish(seq, SeqStatus.FINISHED_LENGTH)
            finished.append(seq)
    sched.check_invariants()
    return finished


def test_chunked_prefill_splits_long_prompt():
    sched = new_scheduler(num_blocks=32, max_tokens=8)
    seq = make_seq(0, list(range(20)), max_tokens=2)
    sched.add(seq)
    chunks = []
    for _ in range(3):
        out = sched.schedule()
        chunks.append(out.scheduled[0].num_scheduled_tokens)
        sched.update_after_step(out)
    assert chunks == [8, 8, 4]
    assert seq.num_computed_tokens == 20


def test_long_prefill_threshold_caps_each_sequence_chunk():
    pool = BlockPool(64, 4, True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=40, max_num_seqs=4, max_model_len=256,
                                      long_prefill_token_threshold=6), pool)
    a, b = make_seq(0, list(range(14)), max_tokens=1), make_seq(1, list(range(100, 104)), max_tokens=1)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    assert {s.seq.seq_id: s.num_scheduled_tokens for s in out.scheduled} == {0: 6, 1: 4}
    sched.update_after_step(out)
    second = sched.schedule()
    assert [s.num_scheduled_tokens for s in second.scheduled if s.seq is a] == [6]
    sched.update_after_step(second)
    last = sched.schedule()
    assert [s.num_scheduled_tokens for s in last.scheduled if s.seq is a] == [2]


def test_prefill_tokens_per_step_cap_admits_arrivals_in_turn():
    """Five 6-token prompts arrive together under a cap of 10: the first two steps admit two each
    (the second admission crosses the cap, so it runs whole), the third the last one, while the
    admitted ones decode; a running chunked prefill does not count against the cap."""
    pool = BlockPool(64, 4, True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256,
                                      max_prefill_tokens_per_step=10), pool)
    seqs = [make_seq(i, list(range(10 * i, 10 * i + 6)), max_tokens=8) for i in range(5)]
    for seq in seqs:
        sched.add(seq)
    admitted = []
    for _ in range(3):
        out = sched.schedule()
        admitted.append(sorted(s.seq.seq_id for s in out.scheduled if s.num_scheduled_tokens > 1))
        assert [s.num_scheduled_tokens for s in out.scheduled if s.num_scheduled_tokens == 1] == \
            [1] * (len(sched.running) - len(admitted[-1]))
        sched.update_after_step(out)
        for item in out.scheduled:
            item.seq.token_ids.append(7)
    assert admitted == [[0, 1], [2, 3], [4]]

    uncapped = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
                         BlockPool(64, 4, True))
    for seq in [make_seq(i, list(range(10 * i, 10 * i + 6)), max_tokens=8) for i in range(5)]:
        uncapped.add(seq)
    assert len(uncapped.schedule().scheduled) == 5

    long = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256,
                                     long_prefill_token_threshold=12, max_prefill_tokens_per_step=10),
                     BlockPool(64, 4, True))
    long.add(make_seq(0, list(range(40)), max_tokens=2))
    long.update_after_step(long.schedule())          # the long prompt's first chunk of 12
    long.add(make_seq(1, list(range(100, 106)), max_tokens=2))
    out = long.schedule()            # admitted beside the running chunk, which yields it the step
    assert {s.seq.seq_id: s.num_scheduled_tokens for s in out.scheduled} == {1: 6}


def test_the_engine_caps_prefill_tokens_per_step_on_cpu_only_unless_told():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    def admission_cap(config: EngineConfig, device: torch.device) -> int:
        return _cap(config.max_prefill_tokens_per_step, DEFAULT_CPU_PREFILL_TOKENS_PER_STEP, device)

    assert admission_cap(EngineConfig(), cpu) == DEFAULT_CPU_PREFILL_TOKENS_PER_STEP == 64
    assert admission_cap(EngineConfig(), cuda) == 0
    assert admission_cap(EngineConfig(max_prefill_tokens_per_step=0), cpu) == 0
    assert admission_cap(EngineConfig(max_prefill_tokens_per_step=200), cuda) == 200
    with pytest.raises(InvalidSamplingParams, match="max_prefill_tokens_per_step"):
        EngineConfig(max_prefill_tokens_per_step=-1)


def test_decodes_are_scheduled_before_prefills():
    sched = new_scheduler(num_blocks=32, max_tokens=16)
    a = make_seq(0, [1, 2, 3], max_tokens=5)
    sched.add(a)
    fake_step(sched)
    sched.add(make_seq(1, list(range(30)), max_tokens=5))
    out = sched.schedule()
    assert out.scheduled[0].seq is a and out.scheduled[0].num_scheduled_tokens == 1
    assert out.scheduled[1].num_scheduled_tokens == 15


def test_preemption_by_recompute_frees_and_resumes():
    sched = new_scheduler(num_blocks=6, block_size=4, max_tokens=64, max_seqs=4, caching=False)
    seqs = [make_seq(i, [i + 1] * 8, max_tokens=8) for i in range(3)]
    for s in seqs:
        sched.add(s)
    done = []
    for _ in range(200):
        done += fake_step(sched)
        if not sched.has_work():
            break
    assert sched.num_preemptions > 0
    assert sorted(s.seq_id for s in done) == [0, 1, 2]
    assert all(s.num_output_tokens == 8 for s in seqs)
    assert sched.block_pool.num_free_blocks == 6


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "step", "abort", "force"]), st.integers(1, 30), st.integers(1, 6)),
                min_size=1, max_size=60),
       st.booleans())
def test_random_operations_never_leak(ops, caching):
    sched = new_scheduler(num_blocks=10, block_size=4, max_tokens=12, max_seqs=3, caching=caching)
    live: list[Sequence] = []
    next_id = 0
    for op, a, b in ops:
        if op == "add" and a + b <= 40:
            seq = make_seq(next_id, [next_id % 3] * a, max_tokens=b)
            next_id += 1
            sched.add(seq)
            live.append(seq)
        elif op == "abort" and live:
            seq = live[a % len(live)]
            if not seq.status.is_finished:
                sched.finish(seq, SeqStatus.FINISHED_ABORTED)
            sched.check_invariants()
        elif op == "force" and sched.running:   # a jump-forward: b tokens appended, not yet computed
            seq = sched.running[a % len(sched.running)]
            if seq.num_computed_tokens == seq.num_tokens - 1:
                seq.token_ids += [8] * min(b, seq.sampling_params.max_tokens - seq.num_output_tokens - 1)
        else:
            fake_step(sched)
    for _ in range(500):
        if not sched.has_work():
            break
        fake_step(sched)
    assert not sched.has_work()
    assert sched.block_pool.num_free_blocks == 10
    assert all(s.num_output_tokens == s.sampling_params.max_tokens for s in live
               if s.status is SeqStatus.FINISHED_LENGTH)


def test_shared_prompt_sent_at_once_is_prefilled_once():
    sched = new_scheduler(num_blocks=64, max_tokens=64, max_seqs=8)
    prompt = list(range(40))
    # two own tokens each: a prefix hit leaves at least two tokens to compute (BlockPool.find_cached_prefix)
    seqs = [make_seq(i, prompt + [100 + i, 100 + i], max_tokens=2) for i in range(4)]
    for s in seqs:
        sched.add(s)
    first = sched.schedule()
    assert [s.seq.seq_id for s in first.scheduled] == [0], "the others wait for seq 0's prompt blocks"
    sched.update_after_step(first)
    seqs[0].token_ids.append(7)                       # its first sampled token
    second = sched.schedule()
    assert sorted(s.seq.seq_id for s in second.scheduled) == [0, 1, 2, 3]
    followers = [s for s in second.scheduled if s.seq.seq_id != 0]
    assert all(s.seq.num_cached_tokens == 40 and s.num_scheduled_tokens == 2 for s in followers)
    sched.update_after_step(second)
    sched.check_invariants()


def test_waiting_on_a_preempted_owner_does_not_deadlock():
    sched = new_scheduler(num_blocks=64, max_tokens=8, max_seqs=8)
    owner = make_seq(0, list(range(20)), max_tokens=1)
    follower = make_seq(1, list(range(20)), max_tokens=1)
    sched.add(owner)
    sched.add(follower)
    out = sched.schedule()
    assert [s.seq.seq_id for s in out.scheduled] == [0]
    sched.finish(owner, SeqStatus.FINISHED_ABORTED)
    out = sched.schedule()
    assert [s.seq.seq_id for s in out.scheduled] == [1]


def test_a_shared_prompt_longer_than_one_chunk_is_still_prefilled_once():
    sched = new_scheduler(num_blocks=64, max_tokens=16, max_seqs=8)   # a 41-token prompt takes 3 steps
    prompt = list(range(40))
    owner = make_seq(0, prompt + [100], max_tokens=1)
    follower = make_seq(1, prompt + [101, 101], max_tokens=1)
    sched.add(owner)
    sched.add(follower)
    for _ in range(3):   # the owner's chunks of 16, 16 and 9 tokens, each cached when computed
        out = sched.schedule()
        assert [s.seq.seq_id for s in out.scheduled] == [0], "the follower waits past every chunk"
        sched.update_after_step(out)
    owner.token_ids.append(7)                         # its first sampled token
    out = sched.schedule()
    assert sorted(s.seq.seq_id for s in out.scheduled) == [0, 1]
    assert follower.num_cached_tokens == 40
    sched.update_after_step(out)
    sched.check_invariants()


def _running_with_forced_run(sched: Scheduler, num_forced: int) -> tuple[Sequence, Sequence]:
    """Two running sequences past their prefill: one decoding, one with `num_forced` grammar-forced
    tokens appended after its sampled one (their K/V not yet computed)."""
    decoding, forced = make_seq(0, [1, 2, 3], max_tokens=20), make_seq(1, [4, 5, 6], max_tokens=20)
    sched.add(decoding)
    sched.add(forced)
    fake_step(sched)
    forced.token_ids += [8] * num_forced
    return decoding, forced


def test_a_step_that_admits_an_arrival_holds_forced_runs_back_one_step():
    sched = new_scheduler(num_blocks=32, max_tokens=64, max_seqs=8)
    decoding, forced = _running_with_forced_run(sched, 4)
    arrival = make_seq(2, list(range(10, 20)), max_tokens=5)
    sched.add(arrival)
    out = sched.schedule()
    assert {s.seq.seq_id: s.num_scheduled_tokens for s in out.scheduled} == {0: 1, 2: 10}, \
        "the arrival's first step carries its prefill and the decode, not the 5-token forced run"
    sched.update_after_step(out)
    decoding.token_ids.append(7)
    arrival.token_ids.append(7)
    sched.add(make_seq(3, list(range(30, 36)), max_tokens=5))
    out = sched.schedule()                    # another arrival: the run is not held a second time
    assert {s.seq.seq_id: s.num_scheduled_tokens for s in out.scheduled} == {0: 1, 1: 5, 2: 1, 3: 6}
    sched.update_after_step(out)
    sched.check_invariants()


def test_a_forced_run_is_not_held_when_no_arrival_is_admitted():
    sched = new_scheduler(num_blocks=32, max_tokens=64, max_seqs=8)
    _, forced = _running_with_forced_run(sched, 4)
    compiling = make_seq(2, list(range(10, 20)), max_tokens=5)
    compiling.status = SeqStatus.WAITING_FOR_GRAMMAR
    sched.add(compiling)
    assert {s.seq.seq_id: s.num_scheduled_tokens for s in sched.schedule().scheduled} == {0: 1, 1: 5}


def test_a_forced_run_is_scheduled_when_the_waiting_arrival_cannot_be_admitted():
    sched = new_scheduler(num_blocks=64, max_tokens=16, max_seqs=8)
    prompt = list(range(100, 140))
    decoding, forced = make_seq(0, [1, 2, 3], max_tokens=20), make_seq(1, [4, 5, 6], max_tokens=20)
    owner, follower = make_seq(2, prompt + [1], max_tokens=1), make_seq(3, prompt + [2], max_tokens=1)
    for seq in (decoding, forced, owner):
        sched.add(seq)
    fake_step(sched)                          # 3 + 3 + the owner's first 10 prompt tokens
    forced.token_ids += [8] * 4
    sched.add(follower)                       # waits for the owner's prompt blocks: not admitted
    out = sched.schedule()
    assert follower.status is SeqStatus.WAITING
    assert {s.seq.seq_id: s.num_scheduled_tokens for s in out.scheduled} == {0: 1, 1: 5, 2: 10}
    sched.update_after_step(out)
    sched.check_invariants()


def _running_long_prompt(sched: Scheduler) -> Sequence:
    """A running sequence 8 tokens into a 40-token prompt (chunks of 8)."""
    long = make_seq(0, list(range(100, 140)), max_tokens=5)
    sched.add(long)
    fake_step(sched)
    assert long.num_computed_tokens == 8
    return long


def _long_prompt_scheduler() -> Scheduler:
    pool = BlockPool(64, 4, True)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256,
                                     long_prefill_token_threshold=8), pool)


def test_a_short_arrival_runs_ahead_of_a_long_prompts_next_chunk_once():
    sched = _long_prompt_scheduler()
    long = _running_long_prompt(sched)
    short = make_seq(1, [1, 2, 3, 4, 5], max_tokens=5)
    sched.add(short)
    out = sched.schedule()
    assert {s.seq.seq_id: s.num_scheduled_tokens for s in out.scheduled} == {1: 5}, \
        "the arrival's first step carries its 5 tokens, not the long prompt's next 8"
    sched.update_after_step(out)
    short.token_ids.append(7)
    sched.add(make_seq(2, [6, 7, 8], max_tokens=5))
    out = sched.schedule()                    # another short arrival: the chunk is not held twice
    assert {s.seq.seq_id: s.num_scheduled_tokens for s in out.scheduled} == {0: 8, 1: 1, 2: 3}
    sched.update_after_step(out)
    assert long.num_computed_tokens == 16
    sched.check_invariants()


def test_a_long_arrival_does_not_overtake_a_running_prompt():
    sched = _long_prompt_scheduler()
    _running_long_prompt(sched)
    sched.add(make_seq(1, list(range(200, 240)), max_tokens=5))   # 40 left against the runner's 32
    out = sched.schedule()
    assert {s.seq.seq_id: s.num_scheduled_tokens for s in out.scheduled} == {0: 8, 1: 8}
    sched.update_after_step(out)
    sched.check_invariants()


def test_held_chunks_keep_their_slots_so_no_step_is_empty_on_a_full_cache():
    """Two long prompts fill the cache in chunks; a short arrival comes when no block is free.
    The held chunks' slots are allocated before admission, so the arrival cannot take them and
    every step runs something (a held chunk without blocks once made the step empty, and the
    engine idled on its inbox)."""
    pool = BlockPool(96, 16, True)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=64, max_model_len=1536,
                                      long_prefill_token_threshold=256, max_prefill_tokens_per_step=64), pool)
    seqs = [make_seq(i, list(range(10_000 * (i + 1), 10_000 * (i + 1) + n)), max_tokens=8)
            for i, n in enumerate((1324, 1061, 80))]
    sched.add(seqs[0])
    sched.add(seqs[1])
    for step in range(200):
        if step == 4:
            sched.add(seqs[2])
        if not sched.has_work():
            break
        out = sched.schedule()
        assert out.scheduled or out.preempted, f"step {step} ran nothing"
        fake_run(sched, out)
    assert all(seq.status is SeqStatus.FINISHED_LENGTH for seq in seqs)

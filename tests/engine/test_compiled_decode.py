"""The compiled decode step (engine/compiled_decode.py) against the eager model it compiles.

Model level: logits of decode batches of 1 and of many sequences (contexts across block edges)
equal eager float32 logits to rounding (atol 1e-4; observed ~3e-6), and the K/V it writes equal
eager's. Engine level: an engine on the compiled step produces the same greedy and seeded tokens as
an eager engine, with prefix hits and preemption, counts its compiled and eager steps, and falls
back to eager (for good) when a call would need a new graph. All on the session's one compile.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from tiny_engine import make_engine

from engine.compiled_decode import CompiledDecode, CompiledDecodeUnavailable
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from test_llm_engine import greedy_requests
from tiny_engine import run_all


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Tiny graphs run on one torch thread (tests/conftest.py)."""


def decode_step(engine: Any, contexts: list[int], seed: int) -> tuple[Any, ...]:
    """Fill `engine`'s cache for sequences of `contexts` tokens by eager prefill, then build the
    next decode step's (input_ids, positions, meta) by hand from the engine's own runner."""
    gen = torch.Generator().manual_seed(seed)
    runner, bs = engine.runner, engine.config.block_size
    tables, next_block = [], 0
    for n in contexts:
        num = -(-(n + 1) // bs)
        tables.append(list(range(next_block, next_block + num)))
        next_block += num
    for table, n in zip(tables, contexts):
        ids = torch.randint(0, 250, (n,), generator=gen)
        step = _metadata(runner, [table], [n], [n])
        runner.model(ids, torch.arange(n), runner.kv_caches, step)
    meta = _metadata(runner, tables, [1] * len(contexts), [n + 1 for n in contexts])
    input_ids = torch.randint(0, 250, (len(contexts),), generator=gen)
    return input_ids, torch.tensor(contexts), meta


def _metadata(runner: Any, tables: list[list[int]], query_lens: list[int], seq_lens: list[int]) -> Any:
    from engine.attention_metadata import AttentionMetadata

    bs = runner.block_size
    width = max(2, max(len(t) for t in tables))
    block_tables = torch.full((len(tables), width), -1, dtype=torch.int32)
    slots = []
    for row, (table, q, n) in enumerate(zip(tables, query_lens, seq_lens)):
        block_tables[row, :len(table)] = torch.tensor(table, dtype=torch.int32)
        slots += [table[p // bs] * bs + p % bs for p in range(n - q, n)]
    cu = [0]
    for q in query_lens:
        cu.append(cu[-1] + q)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots), block_tables=block_tables, cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), query_lens=query_lens, seq_lens_list=seq_lens,
        num_decodes=sum(q == 1 for q in query_lens), block_size=bs, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens))


@pytest.mark.parametrize("contexts", [[20], [15, 16, 17, 31, 32, 33, 1, 90], [47, 3]])
def test_logits_and_kv_match_eager(compiled_tiny, contexts: list[int]) -> None:
    model, _, compiled = compiled_tiny
    engine = make_engine(compiled_tiny)
    with torch.inference_mode():
        input_ids, positions, meta = decode_step(engine, contexts, seed=len(contexts))
        caches = engine.runner.kv_caches
        before = [(k.clone(), v.clone()) for k, v in caches]
        eager = model.compute_logits(model(input_ids, positions, caches, meta))
        eager_kv = [(k.clone(), v.clone()) for k, v in caches]
        for (k, v), (k0, v0) in zip(caches, before):
            k.copy_(k0)
            v.copy_(v0)
        got = compiled.run(input_ids, positions, caches, dataclasses.replace(meta, decode_only=True))
    assert got.shape == eager.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, eager, atol=1e-4, rtol=0)
    owned = slice(0, engine.runner.scratch_block)        # the scratch block is garbage by design
    for (k, v), (ke, ve) in zip(caches, eager_kv):
        torch.testing.assert_close(k[owned], ke[owned], atol=1e-5, rtol=0)
        torch.testing.assert_close(v[owned], ve[owned], atol=1e-5, rtol=0)


@pytest.mark.parametrize("steps", [[(20, 5)], [(15, 1), (0, 7), (30, 3), (16, 16)], [(3, 1), (47, 2)]])
def test_multi_token_queries_as_decode_rows_match_eager(compiled_tiny, steps: list[tuple[int, int]]) -> None:
    """A step of (cached context, query length) per sequence (decodes first, as the scheduler orders them), run through the compiled graph as one
    row per token (`ModelRunner.prepare(decode_only=True)`), gives the eager multi-token step's
    logits at each sequence's last token (the LM head run on those rows only) and the same K/V;
    queries cross block edges (15+1, 16+16)."""
    from engine.scheduler import SchedulerOutput, ScheduledSeq
    from engine.sampling_params import SamplingParams
    from engine.sequence import Sequence

    model, _, compiled = compiled_tiny
    engine = make_engine(compiled_tiny)
    runner, bs = engine.runner, engine.config.block_size
    gen = torch.Generator().manual_seed(len(steps))
    sched, next_block = SchedulerOutput(), 0
    with torch.inference_mode():
        for i, (context, query) in enumerate(steps):
            num = -(-(context + query) // bs)
            seq = Sequence(i, f"r{i}", 0, torch.randint(0, 250, (context + query,), generator=gen).tolist(),
                           context + query, SamplingParams(), 0.0, block_table=list(range(next_block, next_block + num)))
            next_block += num
            if context:
                runner.model(torch.tensor(seq.token_ids[:context]), torch.arange(context), runner.kv_caches,
                             _metadata(runner, [seq.block_table], [context], [context]))
            seq.num_computed_tokens = context
            sched.scheduled.append(ScheduledSeq(seq, query))
        caches = runner.kv_caches
        before = [(k.clone(), v.clone()) for k, v in caches]
        input_ids, positions, meta, sample_idx = runner.prepare(sched)
        eager = model.compute_logits(model(input_ids, positions, caches, meta)[sample_idx])
        eager_kv = [(k.clone(), v.clone()) for k, v in caches]
        for (k, v), (k0, v0) in zip(caches, before):
            k.copy_(k0)
            v.copy_(v0)
        flat_ids, flat_positions, flat_meta, flat_idx = runner.prepare(sched, decode_only=True)
        assert flat_meta.block_tables.shape[0] == sum(q for _, q in steps) and flat_idx.tolist() == sample_idx.tolist()
        got = compiled.run(flat_ids, flat_positions, caches, flat_meta, flat_idx)   # the head on these rows only
        none_sampled = compiled.run(flat_ids, flat_positions, caches, flat_meta, flat_idx[:0])
    assert got.shape == eager.shape and none_sampled.shape == (0, eager.shape[1])
    torch.testing.assert_close(got, eager, atol=1e-4, rtol=0)
    owned = slice(0, runner.scratch_block)
    for (k, v), (ke, ve) in zip(caches, eager_kv):
        torch.testing.assert_close(k[owned], ke[owned], atol=1e-5, rtol=0)
        torch.testing.assert_close(v[owned], ve[owned], atol=1e-5, rtol=0)


def test_engine_outputs_match_eager_with_preemption_and_prefix_hits(compiled_tiny) -> None:
    eager = run_all(make_engine(compiled_tiny[:2]), greedy_requests())
    compiled_engine = make_engine(compiled_tiny, num_blocks=9)       # tight: preempts and resumes
    assert run_all(compiled_engine, greedy_requests()) == eager
    assert compiled_engine.scheduler.num_preemptions > 0
    again = run_all(compiled_engine, greedy_requests())
    assert again == eager
    assert compiled_engine.stats().compiled_steps > 0
    # both prompts in one step of 140 tokens (no admission cap): eager, then compiled
    roomy = make_engine(compiled_tiny, max_prefill_tokens_per_step=0)
    long_prompts = greedy_requests(n_requests=2, prompt_len=70, max_tokens=30)
    assert run_all(roomy, long_prompts) == run_all(make_engine(compiled_tiny[:2]), long_prompts)
    stats = roomy.stats()
    assert stats.compiled_steps > 0 and stats.eager_steps > 0
    assert stats.compiled_steps + stats.eager_steps == roomy.runner.num_compiled_steps + roomy.runner.num_eager_steps


def test_seeded_choices_match_eager(compiled_tiny) -> None:
    params = SamplingParams(temperature=1.0, n=3, seed=11, max_tokens=12, ignore_eos=True)
    requests = [EngineRequest("a", list(range(40)), params)]
    compiled_engine = make_engine(compiled_tiny)
    assert run_all(compiled_engine, requests) == run_all(make_engine(compiled_tiny[:2]), requests)
    assert compiled_engine.stats().compiled_steps >= 10


def test_a_call_that_would_recompile_falls_back_to_eager(compiled_tiny) -> None:
    model, _, compiled = compiled_tiny
    engine = make_engine(compiled_tiny)
    with torch.inference_mode():
        input_ids, positions, meta = decode_step(engine, [5, 9], seed=0)
        wide = dataclasses.replace(meta, decode_only=True, block_tables=meta.block_tables.long())
        with pytest.raises(CompiledDecodeUnavailable, match="recompile"):
            compiled.run(input_ids, positions, engine.runner.kv_caches, wide)
    engine.runner.compiled = _Recompiling(compiled)
    tokens = run_all(engine, greedy_requests(n_requests=2, max_tokens=5))
    assert engine.runner.compiled is None and engine.stats().compiled_steps == 0
    assert tokens == run_all(make_engine(compiled_tiny[:2]), greedy_requests(n_requests=2, max_tokens=5))


class _Recompiling:
    """A ready compiled step whose every call needs a new graph (int64 block tables)."""

    ready = True

    def __init__(self, compiled: CompiledDecode) -> None:
        self.compiled = compiled

    def run(self, input_ids, positions, kv_caches, meta, sample_idx=None):
        meta = dataclasses.replace(meta, block_tables=meta.block_tables.long())
        return self.compiled.run(input_ids, positions, kv_caches, meta, sample_idx)


def test_background_warm_up_while_eager_serves(compiled_tiny) -> None:
    """compile_decode=True: the engine warms its own CompiledDecode up on a thread while steps run
    eagerly, then serves decodes through it; outputs equal eager throughout."""
    model, arch, _ = compiled_tiny
    engine = make_engine((model, arch), compile_decode=True)
    compiled = engine.runner.compiled
    assert isinstance(compiled, CompiledDecode)
    requests = greedy_requests(n_requests=3, max_tokens=30)
    first = run_all(engine, requests)
    assert compiled.wait(timeout_s=300), compiled.error      # a cache hit: seconds
    before = engine.stats().compiled_steps
    assert run_all(engine, requests) == first == run_all(make_engine((model, arch)), requests)
    assert engine.stats().compiled_steps > before


def test_warm_up_covers_each_side_of_every_weight_copy_crossover() -> None:
    """A model whose decoder projections switch from int4/int8 to bf16 copies past `crossover_rows`
    has a graph on each side: the warm-up compiles a batch just past the crossover (seen in serving:
    a warm-up of 2 sequences only left 9+ sequences to a recompile that turned the compiled step
    off). The LM head runs after the graph, so its crossover adds none; nor do layers served by
    their int4 copies at every row count (ALL_ROWS)."""
    from types import SimpleNamespace

    from engine import ALL_ROWS
    from engine.compiled_decode import WARM_UP_TABLE_WIDTH, check_shapes, warm_up_shapes

    quantized = SimpleNamespace(weight_summary=SimpleNamespace(crossover_rows={"layer": 8, "head": 1}))
    assert warm_up_shapes(quantized) == [(1, WARM_UP_TABLE_WIDTH), (2, WARM_UP_TABLE_WIDTH), (9, WARM_UP_TABLE_WIDTH)]
    assert {n for n, _ in check_shapes(quantized)} >= {1, 3, 8, 11}
    head_apart = SimpleNamespace(weight_summary=SimpleNamespace(crossover_rows={"layer": 8, "head": 4}))
    assert [n for n, _ in warm_up_shapes(head_apart)] == [1, 2, 9]
    all_rows = SimpleNamespace(weight_summary=SimpleNamespace(crossover_rows={"layer": ALL_ROWS, "head": 8}))
    assert [n for n, _ in warm_up_shapes(all_rows)] == [1, 2]
    dense = SimpleNamespace(weight_summary=None)
    assert warm_up_shapes(dense) == [(1, WARM_UP_TABLE_WIDTH), (2, WARM_UP_TABLE_WIDTH)]


def test_warm_up_compiles_each_thread_count_the_engine_steps_with() -> None:
    """Dynamo guards a graph on torch's thread count: with the step-thread rule (1 thread below 9
    rows, 2 from it; engine/step_threads.py) every (copy regime, threads) pair the engine can call
    gets its graph (seen in CI: graphs compiled on the warm-up thread's 2 threads, 1-thread decode
    steps then failed the guard and turned the compiled step off). When the rule's boundary and the
    crossover agree, three graphs (one sequence, up to the crossover, past it); when they differ, a
    fourth for the rows between them."""
    from types import SimpleNamespace

    from engine.step_threads import SMALL_STEP_ROWS, StepThreads

    from engine.compiled_decode import warm_up_shapes

    rule = StepThreads(2, SMALL_STEP_ROWS)
    agree = SimpleNamespace(weight_summary=SimpleNamespace(crossover_rows={"layer": SMALL_STEP_ROWS - 1}))
    assert [(n, rule.threads_for(n)) for n, _ in warm_up_shapes(agree, rule.threads_for)] == [
        (1, 1), (2, 1), (SMALL_STEP_ROWS, 2)]
    apart = SimpleNamespace(weight_summary=SimpleNamespace(crossover_rows={"layer": 4}))
    assert [(n, rule.threads_for(n)) for n, _ in warm_up_shapes(apart, rule.threads_for)] == [
        (1, 1), (2, 1), (5, 1), (SMALL_STEP_ROWS, 2)]
    dense = SimpleNamespace(weight_summary=None)
    assert [n for n, _ in warm_up_shapes(dense, rule.threads_for)] == [1, 2, SMALL_STEP_ROWS]


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def test_a_compiled_step_writes_the_cache_in_place(compiled_tiny) -> None:
    """A decode step touches only its sequences' blocks: a graph that copied a cache to write one slot
    into it (as it did when the caches were views of one storage) would make all of it resident and
    stream it every step."""
    model, arch, compiled = compiled_tiny
    engine = make_engine(compiled_tiny, num_blocks=16384)
    cache_mib = sum(k.numel() * k.element_size() * 2 for k, _ in engine.runner.kv_caches) / 2**20
    assert cache_mib >= 128
    with torch.inference_mode():
        input_ids, positions, meta = decode_step(engine, [20, 5], seed=3)
        before = _rss_mib()
        compiled.run(input_ids, positions, engine.runner.kv_caches, dataclasses.replace(meta, decode_only=True))
        grown = _rss_mib() - before
    assert grown < cache_mib / 8, f"{grown:.0f} MiB resident after one step over a {cache_mib:.0f} MiB cache"


def test_warm_up_lets_the_traced_graphs_go(compiled_tiny) -> None:
    """After warm-up no compiled function keeps a handle on its traced GraphModule (the
    `drop_traced_graphs` attributes, or anything else in its attributes or closure), and the
    graphs still serve."""
    import engine.compiled_decode as compiled_decode

    model, _, compiled = compiled_tiny
    fns = [fn for name, fn in vars(compiled_decode).items() if name.startswith("__compiled_fn")]
    assert fns, "dynamo installed no compiled function in engine.compiled_decode"
    for fn in fns:
        while fn is not None:
            assert not set(vars(fn)) & set(compiled_decode._TRACE_HANDLES)
            held = [*vars(fn).values(), *(cell.cell_contents for cell in getattr(fn, "__closure__", None) or ())]
            assert not [value for value in held if isinstance(value, torch.fx.GraphModule)
                        or isinstance(getattr(value, "__self__", None), torch.fx.GraphModule)]
            fn = getattr(fn, "__wrapped__", None)
    assert compiled_decode.drop_traced_graphs() == 0
    engine = make_engine(compiled_tiny)
    with torch.inference_mode():
        input_ids, positions, meta = decode_step(engine, [5, 9], seed=3)
        got = compiled.run(input_ids, positions, engine.runner.kv_caches, dataclasses.replace(meta, decode_only=True))
    assert got.shape == (2, model.arch.vocab_size) and bool(torch.isfinite(got).all())


def test_which_steps_run_as_compiled_rows() -> None:
    """Decode-only steps always; short multi-token steps while their queries read few keys."""
    from engine.model_runner import COMPILED_STEP_MAX_TOKENS, runs_compiled

    assert runs_compiled([1] * 200, [3000] * 200)
    assert runs_compiled([1] * 7 + [12], [601] * 7 + [1012])
    assert runs_compiled([11] * 8, [381] * 8)                 # 8 forced runs: 34k keys
    assert runs_compiled([COMPILED_STEP_MAX_TOKENS], [COMPILED_STEP_MAX_TOKENS])
    assert not runs_compiled([COMPILED_STEP_MAX_TOKENS + 1], [COMPILED_STEP_MAX_TOKENS + 1])
    assert not runs_compiled([1, 32], [600, 1032])            # 33k keys for one query
    assert not runs_compiled([128], [428])

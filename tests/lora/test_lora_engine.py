"""LoRA inside the engine: prefix-cache isolation between adapters (and between two loads of one
name), more adapters than slots under concurrent load, loading and unloading while requests run.
Every output is checked against transformers + peft running that adapter alone (tiny Llama)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lora_support import (
    greedy_request,
    make_adapters,
    make_engine,
    peft_model,
    reference_greedy,
    run_to_completion,
    save_tiny_llama,
)

from lora.config import LoraConfig, LoraModuleSpec
from lora.errors import LoraAdapterNotFound

NUM_NEW_TOKENS = 8


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, dict[str, Path], Callable[[str | None, list[int]], list[int]]]:
    """(base folder, adapter folders incl. a fourth one, memoized reference(adapter, prompt))."""
    tmp = tmp_path_factory.mktemp("lora_engine")
    save_tiny_llama(tmp / "base")
    specs = {"ad1": (4, 8, ["q_proj", "v_proj"], False), "ad2": (8, 8, ["o_proj", "gate_proj"], True),
             "ad3": (2, 4, ["k_proj", "down_proj"], False), "ad4": (6, 12, ["up_proj", "q_proj"], False)}
    folders = make_adapters(tmp, tmp / "base", specs)
    memo: dict[tuple[str | None, tuple[int, ...]], list[int]] = {}
    models: dict[str | None, object] = {}

    def reference(adapter: str | None, prompt: list[int]) -> list[int]:
        key = (adapter, tuple(prompt))
        if key not in memo:
            if adapter not in models:
                models[adapter] = peft_model(tmp / "base", folders[adapter] if adapter else None)
            memo[key] = reference_greedy(models[adapter], prompt, NUM_NEW_TOKENS)[0]
        return memo[key]

    return tmp / "base", folders, reference


def modules(folders: dict[str, Path], *names: str) -> tuple[LoraModuleSpec, ...]:
    return tuple(LoraModuleSpec(name, str(folders[name])) for name in names)


def run_one(engine, rid: str, prompt: list[int], adapter: str | None) -> tuple[list[int], int]:
    """(tokens, num_cached_tokens) of one request run alone."""
    engine.add_request(greedy_request(rid, prompt, NUM_NEW_TOKENS, adapter))
    cached = []
    tokens: list[int] = []
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            cached.append(out.num_cached_tokens)
            tokens += [t for d in out.deltas for t in d.token_ids]
    return tokens, cached[-1]


def test_prefix_cache_is_keyed_by_adapter_and_load(setup) -> None:
    base_dir, folders, reference = setup
    engine = make_engine(base_dir, LoraConfig(max_loras=2, max_lora_rank=8, modules=modules(folders, "ad1", "ad2")))
    prompt = list(range(40, 62))   # 22 tokens: 5 full blocks of 4 can be cached
    runs = [("b0", "ad2", 0), ("a0", "ad1", 0), ("b1", "ad2", 20), ("base0", None, 0), ("base1", None, 20),
            ("a1", "ad1", 20)]
    pool = engine.block_pool
    for rid, adapter, expected_cached in runs:
        hits_before = pool.stats.hits
        tokens, cached = run_one(engine, rid, prompt, adapter)
        assert tokens == reference(adapter, prompt), rid
        assert cached == expected_cached and pool.stats.hits - hits_before == expected_cached, rid
    # the name ad1 now holds ad3's weights: a new adapter_id, so the old ad1 blocks never match
    engine.lora.registry.unload("ad1").result(timeout=0)
    engine.lora.registry.load("ad1", str(folders["ad3"]))
    tokens, cached = run_one(engine, "c0", prompt, "ad1")
    assert tokens == reference("ad3", prompt) and cached == 0
    assert run_one(engine, "c1", prompt, "ad1") == (reference("ad3", prompt), 20)


def test_more_adapters_than_slots_under_concurrent_load(setup) -> None:
    base_dir, folders, reference = setup
    config = LoraConfig(max_loras=2, max_lora_rank=8, max_cpu_loras=2,
                        modules=modules(folders, "ad1", "ad2", "ad3", "ad4"))
    engine = make_engine(base_dir, config, max_num_seqs=6)
    gen = torch.Generator().manual_seed(5)
    adapters = ["ad1", "ad2", "ad3", "ad4", None]
    requests = {f"r{i}": (adapters[i % 5], torch.randint(1, 256, (3 + i % 7,), generator=gen).tolist())
                for i in range(15)}
    for rid, (adapter, prompt) in requests.items():
        engine.add_request(greedy_request(rid, prompt, NUM_NEW_TOKENS, adapter))
    resident_per_step = []
    execute = engine.runner.execute

    def spy(sched):
        resident_per_step.append({item.seq.adapter_id for item in sched.scheduled} - {0})
        order = [(item.num_scheduled_tokens != 1, engine.lora.slot_of(item.seq.adapter_id)) for item in sched.scheduled]
        assert order == sorted(order)        # decodes first, then grouped by slot
        return execute(sched)

    engine.runner.execute = spy
    outputs = run_to_completion(engine)
    for rid, (adapter, prompt) in requests.items():
        assert outputs[rid] == reference(adapter, prompt), rid
    assert max(len(ids) for ids in resident_per_step) == 2      # never more adapters than slots in a step
    assert engine.lora.num_slot_loads >= 4
    assert all(refs == 0 for refs in engine.lora.slot_refs)


def test_one_slot_runs_each_adapters_queued_requests_together(setup) -> None:
    """Two adapters alternating in the queue, one slot: each adapter's queued requests share the
    slot in one batch (draining at the first refusal used to run them one at a time)."""
    base_dir, folders, reference = setup
    engine = make_engine(base_dir, LoraConfig(max_loras=1, max_lora_rank=8, modules=modules(folders, "ad1", "ad2")))
    requests = {f"r{i}": (("ad1", "ad2")[i % 2], list(range(20 + i, 30 + i))) for i in range(12)}
    for rid, (adapter, prompt) in requests.items():
        engine.add_request(greedy_request(rid, prompt, NUM_NEW_TOKENS, adapter))
    batch_sizes = []
    execute = engine.runner.execute

    def spy(sched):
        batch_sizes.append(len(sched.scheduled))
        return execute(sched)

    engine.runner.execute = spy
    outputs = run_to_completion(engine)
    for rid, (adapter, prompt) in requests.items():
        assert outputs[rid] == reference(adapter, prompt), rid
    assert max(batch_sizes) == 6 and len(batch_sizes) == 2 * NUM_NEW_TOKENS
    assert engine.lora.slot_refs == (0,) and engine.lora.num_slot_loads == 2


def test_unload_waits_for_running_requests_and_load_while_running(setup) -> None:
    base_dir, folders, reference = setup
    engine = make_engine(base_dir, LoraConfig(max_loras=2, max_lora_rank=8, modules=modules(folders, "ad1")))
    prompts = {f"a{i}": list(range(10 + i, 20 + i)) for i in range(3)}
    for rid, prompt in prompts.items():
        engine.add_request(greedy_request(rid, prompt, NUM_NEW_TOKENS, "ad1"))
    engine.add_request(greedy_request("base", prompts["a0"], NUM_NEW_TOKENS, None))
    outputs: dict[str, list[int]] = {}
    for _ in range(3):
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(t for d in out.deltas for t in d.token_ids)
    unloaded = engine.lora.registry.unload("ad1")
    engine.lora.registry.load("ad2", str(folders["ad2"]))      # a different rank joins mid-run
    assert not unloaded.done()
    with pytest.raises(LoraAdapterNotFound):
        engine.add_request(greedy_request("late", prompts["a0"], NUM_NEW_TOKENS, "ad1"))
    engine.add_request(greedy_request("b", prompts["a1"], NUM_NEW_TOKENS, "ad2"))
    for rid, tokens in run_to_completion(engine).items():
        outputs.setdefault(rid, []).extend(tokens)
    assert unloaded.done()
    for rid, prompt in prompts.items():
        assert outputs[rid] == reference("ad1", prompt), rid
    assert outputs["base"] == reference(None, prompts["a0"])
    assert outputs["b"] == reference("ad2", prompts["a1"])
    assert [a.name for a in engine.lora.registry.adapters()] == ["ad2"]
    with pytest.raises(LoraAdapterNotFound):
        engine.lora.registry.unload("nope")


def test_adapter_request_without_lora_is_not_found(setup) -> None:
    base_dir, _, _ = setup
    engine = make_engine(base_dir, None)
    with pytest.raises(LoraAdapterNotFound, match="`ad1` does not exist"):
        engine.add_request(greedy_request("x", [1, 2, 3], 2, "ad1"))
    assert not engine.has_work()

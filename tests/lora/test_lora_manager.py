"""LoraRegistry (names, ids, host LRU, unload futures) and LoraManager (slots, eviction, draining,
the per-step LoraBatch) with adapters built in memory."""

from __future__ import annotations

import pytest
import torch

from lora.adapter import LoraAdapter
from lora.config import LoraConfig
from lora.errors import InvalidLoraAdapter, LoraAdapterExists, LoraAdapterNotFound
from lora.manager import LoraManager
from lora.registry import LoraRegistry
from lora.targets import llama_lora_spec

SPEC = llama_lora_spec(num_layers=2, hidden_size=16, q_size=16, kv_size=8, intermediate_size=24)


def random_adapter(path: str, rank: int = 2, modules: tuple[str, ...] = ("q_proj", "v_proj"), seed: int = 0) -> LoraAdapter:
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(SPEC.num_layers):
        for module in modules:
            target = SPEC.targets[module]
            weights[(layer, module)] = (torch.randn(rank, target.in_features, generator=gen),
                                        torch.randn(target.out_features, rank, generator=gen))
    return LoraAdapter(path, rank, float(rank), False, frozenset(modules), weights)


class Reader:
    """`read(path)` for the registry: adapters by path, counting reads; "bad" paths fail."""

    def __init__(self, adapters: dict[str, LoraAdapter]) -> None:
        self.adapters = adapters
        self.reads: list[str] = []

    def __call__(self, path: str) -> LoraAdapter:
        self.reads.append(path)
        if path not in self.adapters:
            raise InvalidLoraAdapter(f"cannot read {path}")
        return self.adapters[path]


def make_manager(max_loras: int, adapters: dict[str, LoraAdapter] | None = None) -> LoraManager:
    """A manager with adapters loaded under their paths' names (default: a, b, c on q/v, rank 2)."""
    adapters = adapters or {n: random_adapter(n, seed=i) for i, n in enumerate("abc")}
    manager = LoraManager(LoraConfig(max_loras=max_loras, max_lora_rank=4), SPEC, torch.float32,
                          torch.device("cpu"), read=Reader(adapters))
    for name in adapters:
        manager.registry.load(name, name)
    return manager


def test_registry_ids_duplicates_and_replace() -> None:
    reader = Reader({"p1": random_adapter("p1"), "p2": random_adapter("p2")})
    registry = LoraRegistry(reader, max_cpu_loras=None)
    first = registry.load("x", "p1", base_model_name="base")
    with pytest.raises(LoraAdapterExists):
        registry.load("x", "p2")
    assert reader.reads == ["p1"]                     # refused before reading
    adapter_id = registry.pin("x", 1)
    second = registry.load("x", "p2", replace=True)
    assert second.adapter_id > first.adapter_id == adapter_id
    assert registry.weights(adapter_id).path == "p1"  # the old load lives on for its sequence
    assert not registry.is_live(adapter_id) and registry.is_live(second.adapter_id)
    registry.unpin(adapter_id)
    with pytest.raises(KeyError):
        registry.weights(adapter_id)
    assert [(a.name, a.path, a.base_model_name) for a in registry.adapters()] == [("x", "p2", None)]


def test_registry_unload_future_and_host_lru() -> None:
    reader = Reader({p: random_adapter(p) for p in ("p1", "p2", "p3")})
    registry = LoraRegistry(reader, max_cpu_loras=2)
    for i in (1, 2, 3):
        registry.load(f"n{i}", f"p{i}")
    assert reader.reads == ["p1", "p2", "p3"]
    registry.pin("n1", 2)                             # n1 was evicted from host memory: read again
    assert reader.reads[-1] == "p1"
    future = registry.unload("n1")
    assert not future.done() and not registry.has("n1")
    with pytest.raises(LoraAdapterNotFound):
        registry.pin("n1", 1)
    adapter_id = 1
    registry.unpin(adapter_id)
    assert not future.done()
    registry.unpin(adapter_id)
    assert future.done()
    assert registry.unload("n2").done()               # unused: at once
    reader.adapters.pop("p3")
    registry.pin("n3", 1)                             # still in host memory: no read
    registry.load("n4", "p1")
    registry.load("n5", "p2")                         # n3 is pinned, so it survives the trim
    assert registry.weights(3).path == "p3"


def test_pin_failure_releases_the_count() -> None:
    reader = Reader({"p1": random_adapter("p1"), "p2": random_adapter("p2")})
    registry = LoraRegistry(reader, max_cpu_loras=1)
    registry.load("n1", "p1")
    registry.load("n2", "p2")
    reader.adapters.pop("p1")
    with pytest.raises(InvalidLoraAdapter):
        registry.pin("n1", 2)
    assert registry.unload("n1").done()               # no sequence was left counted


def test_slots_are_shared_evicted_lru_and_drained() -> None:
    manager = make_manager(max_loras=2)
    ids = {a.name: a.adapter_id for a in manager.registry.adapters()}
    for name in "abc":
        manager.begin_request(name, 4)
    assert manager.num_resident_adapters == 0
    assert manager.acquire_slot(ids["a"]) and manager.acquire_slot(ids["a"]) and manager.acquire_slot(ids["b"])
    assert manager.num_resident_adapters == 2
    assert manager.slot_of(ids["a"]) != manager.slot_of(ids["b"]) and manager.slot_of(0) == -1
    assert not manager.acquire_slot(ids["c"])         # both slots held: c waits
    manager.end_admission()                           # after the pass, b's slot (fewest holders) drains
    assert not manager.acquire_slot(ids["b"])         # no new holder joins a draining slot
    assert manager.acquire_slot(ids["a"])
    manager.release_slot(ids["b"])
    assert manager.acquire_slot(ids["c"])             # b's slot is idle now: c takes it
    assert manager.slot_of(ids["b"]) == -1 and manager.num_slot_loads == 3
    assert manager.num_resident_adapters == 2         # c replaced b: still two slots in use
    for _ in range(3):
        manager.release_slot(ids["a"])
    manager.release_slot(ids["c"])
    assert manager.acquire_slot(ids["b"])             # evicts the least recently used idle slot (a)
    assert manager.slot_of(ids["a"]) == -1 and manager.slot_of(ids["c"]) >= 0


def test_unloaded_adapters_are_evicted_first() -> None:
    manager = make_manager(max_loras=2)
    ids = {a.name: a.adapter_id for a in manager.registry.adapters()}
    for name in "ab":
        manager.begin_request(name, 1)
        assert manager.acquire_slot(ids[name])
        manager.release_slot(ids[name])
        manager.end_sequence(ids[name])
    manager.registry.unload("b")
    manager.begin_request("c", 1)
    assert manager.acquire_slot(ids["c"])
    assert manager.slot_of(ids["a"]) >= 0 and manager.slot_of(ids["b"]) == -1


def test_batch_applies_each_tokens_adapter() -> None:
    kv_adapter = random_adapter("kv", rank=3, modules=("k_proj", "v_proj", "up_proj", "down_proj"), seed=7)
    by_name = {"a": random_adapter("a", seed=1), "b": random_adapter("b", seed=2), "kv": kv_adapter}
    manager = make_manager(max_loras=3, adapters=by_name)
    adapters = {1: by_name["a"], 2: by_name["b"], 3: kv_adapter}
    for name, adapter_id in zip(by_name, adapters):
        assert manager.begin_request(name, 1) == adapter_id and manager.acquire_slot(adapter_id)
    seq_adapters, query_lens = [3, 0, 1, 3, 2], [2, 1, 3, 1, 2]
    batch = manager.prepare_batch([manager.slot_of(a) if a else -1 for a in seq_adapters], query_lens)
    assert batch is not None and batch.widths == {"qkv": 6, "gate_up": 3, "down": 3}
    token_adapters = [a for a, n in zip(seq_adapters, query_lens) for _ in range(n)]
    for projection, modules in SPEC.projection_modules().items():
        in_f, out_f = SPEC.projection_shape(projection)
        x = torch.randn(len(token_adapters), in_f)
        y = torch.randn(len(token_adapters), out_f)
        expected = y.clone()
        for token, adapter_id in enumerate(token_adapters):
            for target in modules:
                pair = adapters[adapter_id].weights.get((1, target.module)) if adapter_id else None
                if pair is not None:
                    rows = slice(target.out_offset, target.out_offset + target.out_features)
                    expected[token, rows] += pair[1] @ (pair[0] @ x[token])
        batch.apply(1, projection, x, y)
        torch.testing.assert_close(y, expected, atol=1e-5, rtol=1e-5)
    assert manager.prepare_batch([-1, -1], [3, 1]) is None

"""The loaded adapters by name, their host-memory weights (LRU), and who is using them.

Thread-safe: the api thread loads and unloads (through the async engine), the engine thread pins
adapters for its sequences. Each load gets a new `adapter_id` (never reused, never 0), so the
prefix cache never mixes KV of two loads of one name. An unloaded adapter disappears from the
names at once; its weights are dropped, and its unload future resolved, when its last sequence
ends.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from lora.adapter import LoraAdapter
from lora.errors import InvalidLoraAdapter, LoraAdapterExists, LoraAdapterNotFound


@dataclass(frozen=True, slots=True)
class LoraAdapterInfo:
    """What /v1/models lists for an adapter."""

    name: str
    path: str
    base_model_name: str | None
    adapter_id: int


@dataclass(slots=True)
class _Record:
    info: LoraAdapterInfo
    num_seqs: int = 0                       # unfinished sequences using the adapter
    removed: bool = False
    waiters: list[Future[None]] = field(default_factory=list)


class LoraRegistry:
    """Names -> adapters, with host weights kept for at most `max_cpu_loras` idle adapters.

    `read(path)` reads and validates an adapter folder (raises InvalidLoraAdapter); it is called
    outside the lock, for loads and for re-reading adapters evicted from host memory.
    """

    def __init__(self, read: Callable[[str], LoraAdapter], max_cpu_loras: int | None) -> None:
        self._read = read
        self._max_cpu_loras = max_cpu_loras
        self._lock = threading.Lock()
        self._by_name: dict[str, _Record] = {}
        self._by_id: dict[int, _Record] = {}
        self._host: OrderedDict[int, LoraAdapter] = OrderedDict()
        self._next_id = 1

    def adapters(self) -> list[LoraAdapterInfo]:
        """The loaded adapters, in load order."""
        with self._lock:
            return [r.info for r in self._by_name.values()]

    def has(self, name: str) -> bool:
        """True when `name` is a loaded adapter."""
        with self._lock:
            return name in self._by_name

    def load(self, name: str, path: str, base_model_name: str | None = None, replace: bool = False) -> LoraAdapterInfo:
        """Read, validate and register an adapter under `name` (blocking disk read).

        With `replace`, an adapter already named so is unloaded first (its running sequences
        finish on the old weights). Raises InvalidLoraAdapter, or LoraAdapterExists when the
        name is taken and `replace` is False (checked before and after the read).
        """
        if not replace and self.has(name):
            raise LoraAdapterExists(f"The LoRA adapter '{name}' has already been loaded.", param="lora_name")
        adapter = self._read(path)
        with self._lock:
            if name in self._by_name:
                if not replace:
                    raise LoraAdapterExists(f"The LoRA adapter '{name}' has already been loaded.", param="lora_name")
                self._remove_locked(self._by_name[name])
            info = LoraAdapterInfo(name, adapter.path, base_model_name, self._next_id)
            self._next_id += 1
            record = _Record(info)
            self._by_name[name] = record
            self._by_id[info.adapter_id] = record
            self._host[info.adapter_id] = adapter
            self._trim_locked()
            return info

    def unload(self, name: str) -> Future[None]:
        """Remove `name` now; the future resolves once no sequence uses the adapter any more.
        Raises LoraAdapterNotFound."""
        with self._lock:
            record = self._by_name.get(name)
            if record is None:
                raise LoraAdapterNotFound(f"The LoRA adapter '{name}' cannot be found.", param="lora_name")
            future: Future[None] = Future()
            record.waiters.append(future)
            self._remove_locked(record)
            return future

    def pin(self, name: str, num_seqs: int) -> int:
        """Count `num_seqs` new sequences on adapter `name` and make sure its weights are in host
        memory (re-reading the folder if they were evicted); returns its adapter_id.
        Raises LoraAdapterNotFound, or InvalidLoraAdapter when a re-read fails."""
        with self._lock:
            record = self._by_name.get(name)
            if record is None:
                raise LoraAdapterNotFound(f"The model `{name}` does not exist.", param="model")
            record.num_seqs += num_seqs
            adapter_id = record.info.adapter_id
            if adapter_id in self._host:
                self._host.move_to_end(adapter_id)
                return adapter_id
        try:
            adapter = self._read(record.info.path)
        except InvalidLoraAdapter:
            for _ in range(num_seqs):
                self.unpin(adapter_id)
            raise
        with self._lock:
            self._host.setdefault(adapter_id, adapter)
            self._trim_locked()
        return adapter_id

    def unpin(self, adapter_id: int) -> None:
        """One sequence of `adapter_id` ended; frees an unloaded adapter when it was the last."""
        with self._lock:
            record = self._by_id[adapter_id]
            record.num_seqs -= 1
            assert record.num_seqs >= 0
            if record.removed and record.num_seqs == 0:
                self._free_locked(record)

    def weights(self, adapter_id: int) -> LoraAdapter:
        """Host weights of a pinned adapter (pinned adapters are never evicted)."""
        with self._lock:
            return self._host[adapter_id]

    def is_live(self, adapter_id: int) -> bool:
        """False once the adapter has been unloaded (even while its last sequences run)."""
        with self._lock:
            record = self._by_id.get(adapter_id)
            return record is not None and not record.removed

    def _remove_locked(self, record: _Record) -> None:
        del self._by_name[record.info.name]
        record.removed = True
        if record.num_seqs == 0:
            self._free_locked(record)

    def _free_locked(self, record: _Record) -> None:
        self._by_id.pop(record.info.adapter_id, None)
        self._host.pop(record.info.adapter_id, None)
        for future in record.waiters:
            if not future.done():
                future.set_result(None)
        record.waiters.clear()

    def _trim_locked(self) -> None:
        if self._max_cpu_loras is None:
            return
        excess = len(self._host) - self._max_cpu_loras
        for adapter_id in list(self._host):
            if excess <= 0:
                break
            if self._by_id[adapter_id].num_seqs == 0:
                del self._host[adapter_id]
                excess -= 1

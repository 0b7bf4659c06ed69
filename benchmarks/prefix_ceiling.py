"""The most prompt tokens a block prefix cache can serve on a given load: `replicas_bench.py`'s ceilings.

A request can be served from the cache at most the longest common prefix it shares with a request
sent before it to the same engine, in whole blocks, at most the engine's own limit
(`engine/block_pool.py` `max_cached_blocks`: the last two prompt tokens are always computed). Requests are taken in the order they were sent; with
concurrent requests an earlier one may still be prefilling, which the engine waits for
(`engine/scheduler.py`'s `_prefix_in_flight`), so the order is what counts, not completion.

- `ideal_ceiling`: every request on one cache (a router that loses nothing, without load limits).
  With 4 distinct system prompts among 32 requests, the first copy of each prompt is cold.
- `ceiling_given_routing`: each replica its own cache, requests where a router actually sent them:
  every replica's first copy of a prompt is cold (a router spreading one prompt over both
  replicas pays that prompt's prefill twice).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from engine.block_pool import max_cached_blocks


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _servable(ids: Sequence[int], earlier: list[Sequence[int]], block_size: int) -> int:
    shared = max((_common_prefix_len(ids, other) for other in earlier), default=0)
    return min(shared // block_size, max_cached_blocks(len(ids), block_size)) * block_size


def ceiling_given_routing(prompts: Sequence[Sequence[int]], replicas: Sequence[Hashable], block_size: int) -> int:
    """Prompt tokens (sum over requests) a prefix cache per replica could serve when request j
    (`prompts[j]`: its prompt token ids, in sending order) went to `replicas[j]`. Raises ValueError
    when the two lengths differ or `block_size` < 1."""
    if len(prompts) != len(replicas) or block_size < 1:
        raise ValueError(f"{len(prompts)} prompts for {len(replicas)} replicas, block_size {block_size}")
    seen: dict[Hashable, list[Sequence[int]]] = {}
    total = 0
    for ids, replica in zip(prompts, replicas):
        earlier = seen.setdefault(replica, [])
        total += _servable(ids, earlier, block_size)
        earlier.append(ids)
    return total


def ideal_ceiling(prompts: Sequence[Sequence[int]], block_size: int) -> int:
    """Prompt tokens one shared prefix cache could serve on these prompts (in sending order)."""
    return ceiling_given_routing(prompts, [0] * len(prompts), block_size)

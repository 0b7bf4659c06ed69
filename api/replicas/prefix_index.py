"""The router's record of which prompt prefixes each replica has recently prefilled.

Per replica, an LRU set of the chained chunk digests (`prefix_hash.py`) of the requests routed to
it; `match_length` is how many leading chunks of a new request one replica has seen, the router's
estimate of that replica's prefix-cache hit (like SGLang's cache-aware router's per-worker prefix
tree, at chunk granularity). The engine may have evicted those blocks since: the estimate only
orders replicas, it promises nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable


class PrefixIndex:
    """Recent prompt-prefix digests per replica key, at most `max_entries_per_replica` (>= 1) each;
    the least recently routed digests are forgotten first."""

    def __init__(self, max_entries_per_replica: int = 100_000) -> None:
        if max_entries_per_replica < 1:
            raise ValueError(f"max_entries_per_replica must be >= 1, not {max_entries_per_replica}")
        self._max_entries = max_entries_per_replica
        self._entries: dict[Hashable, OrderedDict[bytes, None]] = {}

    def record(self, replica: Hashable, digests: tuple[bytes, ...]) -> None:
        """Remember that `replica` prefilled a prompt with these leading chunk digests."""
        entries = self._entries.setdefault(replica, OrderedDict())
        for digest in digests:
            entries[digest] = None
            entries.move_to_end(digest)
        while len(entries) > self._max_entries:
            entries.popitem(last=False)

    def match_length(self, replica: Hashable, digests: tuple[bytes, ...]) -> int:
        """How many leading digests of `digests` `replica` has recorded (0: none, or unknown replica).
        Digests chain their parents, so the first one missing ends the match."""
        entries = self._entries.get(replica)
        if not entries:
            return 0
        length = 0
        for digest in digests:
            if digest not in entries:
                break
            length += 1
        return length

    def forget(self, replica: Hashable) -> None:
        """Drop everything recorded for `replica` (it died: its replacement starts with an empty cache)."""
        self._entries.pop(replica, None)

    def num_entries(self, replica: Hashable) -> int:
        """Digests recorded for `replica`."""
        return len(self._entries.get(replica, ()))

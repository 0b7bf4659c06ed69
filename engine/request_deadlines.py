"""Per-request deadlines for `EngineConfig.request_timeout_s`, kept by the engine thread."""

from __future__ import annotations

import time
from collections.abc import Container


class RequestDeadlines:
    """When each request in the engine must be finished, in time.monotonic() seconds.

    Owned by one thread (the engine loop); not thread-safe. With `timeout_s` None nothing is
    tracked and `expired()` is always empty.
    """

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self._deadlines: dict[str, float] = {}

    def add(self, request_id: str, arrival_time: float) -> None:
        """Track `request_id`, due `timeout_s` after `arrival_time` (0.0: from now)."""
        if self.timeout_s is not None:
            self._deadlines[request_id] = (arrival_time or time.monotonic()) + self.timeout_s

    def expired(self, active_ids: Container[str], now: float | None = None) -> list[str]:
        """Ids of tracked requests past their deadline, in arrival order; forgets them and every
        tracked id no longer in `active_ids` (finished or aborted meanwhile)."""
        if not self._deadlines:
            return []
        now = time.monotonic() if now is None else now
        expired: list[str] = []
        for request_id, deadline in list(self._deadlines.items()):
            if request_id not in active_ids:
                del self._deadlines[request_id]
            elif deadline <= now:
                del self._deadlines[request_id]
                expired.append(request_id)
        return expired

    def wait_s(self, default_s: float, now: float | None = None) -> float:
        """How long the engine thread may sleep waiting for input: `default_s`, or less when a
        deadline comes sooner (never below 0.01 s)."""
        if not self._deadlines:
            return default_s
        now = time.monotonic() if now is None else now
        return max(0.01, min(default_s, min(self._deadlines.values()) - now))

"""The requests the router has placed on each replica, from its choice until Serve reports them done.

Serve's own queue-length cache (`RequestRouter.replica_queue_len_cache`) counts a request from
the moment it is sent (`on_send_request`) and is reset to the replica's own count whenever a
replica answers Serve's rejection protocol. Between the router's choice and the send, Serve lets
other routing tasks run (up to 2 x N at once), which would all see the same queues and pile onto
one replica; so the router counts a request for its replica as soon as it chooses it. It must then
not add Serve's count on top: from the send until the replica accepts, the request would count
twice, and the imbalance fallback (`replica_choice.py`) would fire at a real imbalance of half its
threshold. `OngoingRequests` is that one count: chosen (first choice), moved if Serve sent it
elsewhere (the first choice was full), dropped when Serve reports it complete (on every path,
rejected requests too: `RequestRouter.on_request_completed`) or when it was cancelled before Serve
chose for it (its pending future cancelled: Serve then reports nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable


class OngoingRequests:
    """Request id -> (replica, "was it abandoned before being sent?") for the requests this router
    has routed and Serve has not reported complete."""

    def __init__(self) -> None:
        self._placed: dict[str, tuple[Hashable, Callable[[], bool]]] = {}

    def chosen(self, request_id: str, replica: Hashable, abandoned: Callable[[], bool]) -> Hashable | None:
        """The router chose `replica` for `request_id` (again, when Serve asks anew); `abandoned()`
        is true once the request was cancelled before Serve sent it. Returns the replica it was
        placed on before (None: new)."""
        previous = self._placed.get(request_id)
        self._placed[request_id] = (replica, abandoned)
        return None if previous is None else previous[0]

    def routed(self, request_id: str, replica: Hashable) -> Hashable | None:
        """Serve sent `request_id` to `replica` and it accepted; returns the replica it was counted
        on when that was another one (it moves to `replica`), else None."""
        previous = self._placed.get(request_id)
        if previous is None or previous[0] == replica:
            return None
        self._placed[request_id] = (replica, previous[1])
        return previous[0]

    def completed(self, request_id: str) -> None:
        """Serve reports `request_id` done (answered, failed or rejected by its replica)."""
        self._placed.pop(request_id, None)

    def count(self, replica: Hashable) -> int:
        """Requests placed on `replica` and not done; first forgets the abandoned ones."""
        for request_id in [rid for rid, (_, abandoned) in self._placed.items() if abandoned()]:
            del self._placed[request_id]
        return sum(1 for placed, _ in self._placed.values() if placed == replica)

    def __len__(self) -> int:
        return len(self._placed)

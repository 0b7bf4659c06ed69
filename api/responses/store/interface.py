"""The Responses store interface that every backend implements (SQLite, PostgreSQL), and the
identity and settings a server opens it with.

Several servers may share one store. Each background response has an owner (the server id of the
server running it) and a lease that the owner renews while it runs; a cancel or delete sent to any
server reaches the owner through flags in the row, which the owner reads each time it renews
(`renew_leases`). A response that reached a terminal status is never written again, and a deleted
one stays deleted (its row is a tombstone until retention removes it): a late write from its owner
is refused, never a resurrection.
"""

from __future__ import annotations

import abc
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from api.responses.store.record import StoredResponse


@dataclass(frozen=True, slots=True)
class ServerIdentity:
    """Who writes to the store: `name` is stable across restarts of one server (host:port by
    default), `server_id` is `name` plus a random suffix made at start-up, unique to one process."""

    name: str
    server_id: str

    @classmethod
    def new(cls, name: str) -> ServerIdentity:
        """A fresh identity for this process under `name`."""
        return cls(name, f"{name}/{uuid.uuid4().hex[:12]}")

    @classmethod
    def for_port(cls, port: int) -> ServerIdentity:
        """A fresh identity named `<hostname>:<port>` (what a server listening on `port` uses)."""
        return cls.new(f"{socket.gethostname()}:{port}")


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Timing of leases and retention, in seconds.

    lease_s: how long a background response's lease lasts after each renewal; its owner renews it
        every `lease_s / 4` or sooner (`api/responses/background.py`).
    lease_grace_s: past its expiry by this much, any server fails an unfinished response (its owner
        is gone); the owner's own later processes (same `ServerIdentity.name`) fail it as soon as it
        expires.
    retention_s: finished responses and tombstones older than this are removed; None keeps them.
    Raises ValueError when a value is not positive.
    """

    lease_s: float = 10.0
    lease_grace_s: float = 30.0
    retention_s: float | None = None

    def __post_init__(self) -> None:
        if self.lease_s <= 0 or self.lease_grace_s < 0:
            raise ValueError(f"lease {self.lease_s:g} s must be > 0 and grace {self.lease_grace_s:g} s >= 0")
        if self.retention_s is not None and self.retention_s <= 0:
            raise ValueError(f"--responses-retention must be positive, not {self.retention_s:g} s")


class ResponsesStore(abc.ABC):
    """Stored /v1/responses objects, shared by every server that opens the same location.

    Every coroutine runs its statements off the event loop, in the order they were called on this
    store (a response's statuses land in the order they happened). `close()` when done.
    """

    def __init__(self, identity: ServerIdentity, settings: StoreSettings) -> None:
        self.identity = identity
        self.settings = settings

    @property
    def server_id(self) -> str:
        """This server's id: what `owner_of` returns for the background responses it runs."""
        return self.identity.server_id

    @abc.abstractmethod
    async def put(self, row: StoredResponse) -> bool:
        """Insert or update the row of `row.id`, owned by this server (an unfinished background
        row with a fresh lease). False when nothing was written: the response was deleted, already
        reached a terminal status, or is owned by another server."""

    @abc.abstractmethod
    async def get(self, response_id: str) -> StoredResponse | None:
        """The row of `response_id`, or None (never stored, deleted, or removed by retention)."""

    @abc.abstractmethod
    async def delete(self, response_id: str) -> bool:
        """Delete the response for good (a tombstone stays, so no later write brings it back);
        its owner, if it still runs it, stops at its next renewal. False when there was none."""

    @abc.abstractmethod
    async def history(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation up to and including `response_id`, read in one query: for each
        response of the previous_response_id chain, oldest first, its input items then its output
        items. None when `response_id` is not stored; a deleted ancestor ends the chain there."""

    @abc.abstractmethod
    async def owner_of(self, response_id: str) -> str | None:
        """The server id that created `response_id` (and runs or ran it, for a background
        response: the one server that can stop it); None when it is not stored. A request router
        sends the response's requests there (its conversation's KV blocks are cached there too)."""

    @abc.abstractmethod
    async def request_cancel(self, response_id: str) -> StoredResponse | None:
        """Ask the owner of an unfinished background response to cancel it (a flag in the row).
        When the owner's lease has expired (nobody runs it), store it "cancelled" here instead.
        Returns the row afterwards (None when not stored)."""

    @abc.abstractmethod
    async def renew_leases(self, response_ids: list[str]) -> set[str]:
        """Extend this server's leases of the unfinished responses `response_ids` (those it runs)
        by `settings.lease_s`; return the ids among them that must stop now: deleted, or with a
        cancel requested."""

    @abc.abstractmethod
    async def fail_expired_leases(self) -> int:
        """Store "failed" for unfinished responses whose owner is gone: those of this server's
        earlier processes (same identity name) whose lease expired, and any whose lease expired
        more than `settings.lease_grace_s` ago. Returns how many."""

    @abc.abstractmethod
    async def remove_expired(self) -> int:
        """With `settings.retention_s` set, remove finished responses and tombstones created longer
        ago than that (0 and nothing done without it). Returns how many rows went."""

    @abc.abstractmethod
    def close(self) -> None:
        """Finish the queued operations, give up this server's leases (nothing it owns still runs
        once its background responses are stopped), and close the connection. Idempotent."""

"""The store's operations over one DB-API connection (sqlite3 or psycopg) on one worker thread;
the backends (`sqlite.py`, `postgres.py`) supply the connection and the SQL dialect.

One connection on one thread runs every statement, never on the event loop, in the order they
were called: concurrent writers lose nothing and a response's statuses land in the order they
happened (a "cancelled" write cannot be overtaken by an earlier "in_progress" one). Across
servers, the conditions in the statements (`schema.py`) keep the rules of `ResponsesStore`.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from api.responses.store.interface import ResponsesStore, ServerIdentity, StoreSettings
from api.responses.store.record import UNFINISHED_STATUSES, StoredResponse
from api.responses.store.schema import MAX_CHAIN, Statements

logger = logging.getLogger(__name__)
T = TypeVar("T")
_GONE = {"code": "server_error", "message": "the server running this response stopped before it finished"}


class SqlResponsesStore(ResponsesStore):
    """`ResponsesStore` on a DB-API connection; subclasses implement `_connection()`."""

    def __init__(self, identity: ServerIdentity, settings: StoreSettings, now: str, placeholder: str) -> None:
        """`now`: the dialect's SQL expression of the current time in epoch seconds; `placeholder`:
        its parameter marker (`?` for sqlite3, `%s` for psycopg)."""
        super().__init__(identity, settings)
        self._sql = Statements().for_dialect(now, placeholder)
        self._placeholder = placeholder
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="responses-store")
        self._closed = False

    @abc.abstractmethod
    def _connection(self) -> Any:
        """The open connection (autocommit), reconnecting if the backend can; worker thread only."""

    @abc.abstractmethod
    def _close_connection(self) -> None:
        """Close the connection; worker thread only."""

    def close(self) -> None:
        """See `ResponsesStore.close`; a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            self._worker.submit(self._execute, self._sql.release, (self.server_id,)).result()
        except Exception as exc:  # noqa: BLE001 - closing must finish; the leases then just expire
            logger.warning("could not give up the leases of %s: %s", self.server_id, exc)
        self._worker.submit(self._close_connection).result()
        self._worker.shutdown(wait=True)

    async def put(self, row: StoredResponse) -> bool:
        """See `ResponsesStore.put`."""
        running = row.background and row.status in UNFINISHED_STATUSES
        values = (row.id, row.status, int(row.background), row.previous_response_id, row.response_json,
                  row.input_items_json, self.server_id, self.identity.name,
                  self.settings.lease_s if running else None)
        written = await self._run(lambda: self._execute(self._sql.put, values).rowcount > 0)
        if not written:
            logger.info("response %s: status %s not stored (deleted, final, or not ours)", row.id, row.status)
        return written

    async def get(self, response_id: str) -> StoredResponse | None:
        """See `ResponsesStore.get`."""
        return await self._run(lambda: self._get(response_id))

    async def delete(self, response_id: str) -> bool:
        """See `ResponsesStore.delete`."""
        return await self._run(lambda: self._execute(self._sql.delete, (response_id,)).rowcount > 0)

    async def history(self, response_id: str) -> list[dict[str, Any]] | None:
        """See `ResponsesStore.history`."""
        rows = await self._run(
            lambda: self._execute(self._sql.history, (response_id, MAX_CHAIN)).fetchall())
        if not rows:
            return None
        seen: set[str] = set()
        turns: list[list[dict[str, Any]]] = []
        for found_id, response_json, input_items_json in reversed(rows):  # newest first
            if found_id in seen:
                break  # a cycle (corrupt data): the chain ends where it repeats
            seen.add(found_id)
            turns.append(json.loads(input_items_json) + json.loads(response_json).get("output", []))
        return [item for turn in reversed(turns) for item in turn]

    async def owner_of(self, response_id: str) -> str | None:
        """See `ResponsesStore.owner_of`."""
        found = await self._run(lambda: self._execute(self._sql.owner_of, (response_id,)).fetchone())
        return None if found is None else found[0]

    async def request_cancel(self, response_id: str) -> StoredResponse | None:
        """See `ResponsesStore.request_cancel`."""

        def flag_then_take_over() -> StoredResponse | None:
            self._execute(self._sql.flag_cancel, (response_id,))
            self._end(self._sql.lease_expired, (response_id,), "cancelled", None)
            return self._get(response_id)

        return await self._run(flag_then_take_over)

    async def renew_leases(self, response_ids: list[str]) -> set[str]:
        """See `ResponsesStore.renew_leases`."""
        if not response_ids:
            return set()
        ids = ", ".join([self._placeholder] * len(response_ids))

        def renew() -> set[str]:
            self._execute(self._sql.renew.replace("{ids}", ids),
                          (self.settings.lease_s, self.server_id, *response_ids))
            stop = self._execute(self._sql.must_stop.replace("{ids}", ids), tuple(response_ids)).fetchall()
            return {row[0] for row in stop}

        return await self._run(renew)

    async def fail_expired_leases(self) -> int:
        """See `ResponsesStore.fail_expired_leases`."""
        params = (self.identity.name, self.server_id, self.settings.lease_grace_s)
        failed = await self._run(lambda: self._end(self._sql.abandoned, params, "failed", _GONE))
        if failed:
            logger.warning("marked %d stored responses failed: the servers running them are gone", failed)
        return failed

    async def remove_expired(self) -> int:
        """See `ResponsesStore.remove_expired`."""
        if self.settings.retention_s is None:
            return 0
        removed = await self._run(
            lambda: self._execute(self._sql.remove_expired, (self.settings.retention_s,)).rowcount)
        if removed:
            logger.info("removed %d stored responses past the retention period", removed)
        return int(removed)

    async def _run(self, operation: Callable[[], T]) -> T:
        """Queue `operation()` on the worker thread; await its result. The operation runs even
        when the awaiting task is cancelled meanwhile (it was queued in order)."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, operation)

    def _execute(self, sql: str, params: tuple[Any, ...]) -> Any:
        return self._connection().execute(sql, params)

    def _get(self, response_id: str) -> StoredResponse | None:
        found = self._execute(self._sql.get, (response_id,)).fetchone()
        if found is None:
            return None
        return StoredResponse(found[0], found[1], bool(found[2]), found[3], found[4], found[5], found[6],
                              bool(found[7]))

    def _end(self, where: str, params: tuple[Any, ...], status: str, error: dict[str, str] | None) -> int:
        """Store `status` (and `error`) for each response matching `where`, each with a conditional
        update (`where` again), so a status written meanwhile by its owner stays. Returns how many."""
        rows = self._execute(self._sql.select_where.replace("{where}", where), params).fetchall()
        ended = 0
        for response_id, response_json in rows:
            response = json.loads(response_json)
            response["status"] = status
            response["completed_at"] = int(time.time())
            if error is not None:
                response["error"] = error
            cursor = self._execute(self._sql.end.replace("{where}", where),
                                   (status, json.dumps(response), response_id, *params))
            ended += cursor.rowcount
        return ended

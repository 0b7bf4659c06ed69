"""Stored /v1/responses objects in SQLite (stdlib sqlite3), one row per response.

A row holds the response object's JSON, its input items (a JSON array) and the id of the response
it continues; `history` follows that chain to rebuild a conversation. One connection on one worker
thread runs every operation, never on the event loop, in the order they were called: concurrent
writers lose nothing, a response's statuses land in the order they happened (a "cancelled" write
cannot be overtaken by an earlier "in_progress" one), and `:memory:` works. Files use WAL mode, so
other processes (a second server on the same file) read while this one writes; a crash loses at
most the last writes. Rows of responses still queued or in progress when the previous server
stopped are marked failed on open (one server per file owns its background responses).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

MEMORY = ":memory:"
_MAX_CHAIN = 10_000  # responses followed by `history` (a guard against cycles in a corrupt file)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    background INTEGER NOT NULL,
    previous_response_id TEXT,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL
)
"""
_UNFINISHED = ("queued", "in_progress")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One row: the response object as JSON text and its input items as a JSON array text."""

    id: str
    status: str
    background: bool
    previous_response_id: str | None
    response_json: str
    input_items_json: str

    def input_items(self) -> list[dict[str, Any]]:
        """The input items, parsed."""
        items: list[dict[str, Any]] = json.loads(self.input_items_json)
        return items

    def output_items(self) -> list[dict[str, Any]]:
        """The response's output items, parsed."""
        output: list[dict[str, Any]] = json.loads(self.response_json).get("output", [])
        return output


class ResponsesStore:
    """The SQLite file (or `:memory:`) of stored responses; `close()` when done."""

    def __init__(self, path: str) -> None:
        """Open (creating the file, its folder and the table); raises sqlite3.Error / OSError."""
        if path != MEMORY:
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="responses-store")
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA busy_timeout = 5000")
        if path != MEMORY:
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute(_SCHEMA)
        self._fail_unfinished()

    def close(self) -> None:
        """Finish the queued operations, then close the connection."""
        self._worker.shutdown(wait=True)
        self._conn.close()

    async def put(self, row: StoredResponse) -> None:
        """Insert or replace the row of `row.id`."""
        await self._run(self._put, row)

    async def get(self, response_id: str) -> StoredResponse | None:
        """The row of `response_id`, or None."""
        return await self._run(self._get, response_id)

    async def delete(self, response_id: str) -> bool:
        """Delete the row; False when there was none."""
        return await self._run(self._delete, response_id)

    async def history(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation up to and including `response_id`: for each response of the chain,
        oldest first, its input items then its output items. None when `response_id` is not
        stored; a deleted ancestor ends the chain there."""
        return await self._run(self._history, response_id)

    async def _run(self, operation: Callable[[Any], T], arg: Any) -> T:
        """Queue `operation(arg)` on the worker thread; await its result. The operation runs even
        when the awaiting task is cancelled meanwhile (it was queued in order)."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, operation, arg)

    def _put(self, row: StoredResponse) -> None:
        values = (
            row.id,
            row.status,
            int(row.background),
            row.previous_response_id,
            row.response_json,
            row.input_items_json,
        )
        self._conn.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)", values)

    def _get(self, response_id: str) -> StoredResponse | None:
        found = self._conn.execute(
            "SELECT id, status, background, previous_response_id, response, input_items "
            "FROM responses WHERE id = ?",
            (response_id,),
        ).fetchone()
        if found is None:
            return None
        return StoredResponse(found[0], found[1], bool(found[2]), found[3], found[4], found[5])

    def _delete(self, response_id: str) -> bool:
        cursor = self._conn.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cursor.rowcount > 0

    def _history(self, response_id: str) -> list[dict[str, Any]] | None:
        turns: list[list[dict[str, Any]]] = []
        seen: set[str] = set()
        next_id: str | None = response_id
        while next_id is not None and next_id not in seen and len(seen) < _MAX_CHAIN:
            row = self._get(next_id)
            if row is None:
                if next_id == response_id:
                    return None
                break
            seen.add(next_id)
            turns.append(row.input_items() + row.output_items())
            next_id = row.previous_response_id
        return [item for turn in reversed(turns) for item in turn]

    def _fail_unfinished(self) -> None:
        """Responses left queued / in progress by an earlier process will never finish: mark them failed."""
        rows = self._conn.execute(
            "SELECT id, response FROM responses WHERE status IN (?, ?)", _UNFINISHED
        ).fetchall()
        for response_id, text in rows:
            response = json.loads(text)
            response["status"] = "failed"
            response["error"] = {"code": "server_error", "message": "the server stopped before it finished"}
            self._conn.execute(
                "UPDATE responses SET status = 'failed', response = ? WHERE id = ?",
                (json.dumps(response), response_id),
            )
        if rows:
            logger.warning("marked %d unfinished stored responses failed", len(rows))

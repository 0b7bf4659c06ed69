"""The SQLite backend (stdlib sqlite3): one file on one host, the default.

Files use WAL mode, so several servers on one host can share a file (each reads while another
writes); a crash loses at most the last writes. `:memory:` keeps the responses for the life of
the process. A file written by an earlier structserve (without owners and leases) gets the new
columns on open; its unfinished rows have no lease and are failed by `fail_expired_leases`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from api.responses.store.errors import StoreUnavailable
from api.responses.store.interface import ServerIdentity, StoreSettings
from api.responses.store.schema import COLUMNS, CREATE_INDEXES, CREATE_TABLE
from api.responses.store.sql_store import SqlResponsesStore

MEMORY = ":memory:"
_NOW = "((julianday('now') - 2440587.5) * 86400.0)"   # epoch seconds, millisecond precision


class SqliteResponsesStore(SqlResponsesStore):
    """The SQLite file at `path` (or `:memory:`) of stored responses."""

    def __init__(self, path: str, identity: ServerIdentity, settings: StoreSettings) -> None:
        """Open (creating the file, its folder and the table, adding missing columns); raises
        StoreUnavailable."""
        super().__init__(identity, settings, _NOW, "?")
        self.path = path
        try:
            self._conn = self._open()
        except (OSError, sqlite3.Error) as exc:
            self._worker.shutdown()
            raise StoreUnavailable(path, exc) from exc

    def _open(self) -> sqlite3.Connection:
        if self.path != MEMORY:
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 5000")
        if self.path != MEMORY:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(CREATE_TABLE)
        present = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
        for name, column_type in COLUMNS:
            if name not in present:
                conn.execute(f"ALTER TABLE responses ADD COLUMN {name} {column_type}")
        for statement in CREATE_INDEXES:
            conn.execute(statement)
        return conn

    def _connection(self) -> sqlite3.Connection:
        return self._conn

    def _close_connection(self) -> None:
        self._conn.close()

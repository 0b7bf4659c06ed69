"""The PostgreSQL backend (psycopg 3): one database shared by any number of servers.

`--responses-db postgresql://user@host:port/dbname` (any libpq connection URI). The table is
created on open under a transaction-level advisory lock, so servers starting together do not
race on `CREATE TABLE IF NOT EXISTS`. Times are read from the database's clock, so servers on
hosts whose clocks differ agree on lease expiry. A connection that broke (database restart,
network) is opened again on the next operation; the operation that saw it break raises.
"""

from __future__ import annotations

import psycopg

from api.responses.store.errors import StoreUnavailable
from api.responses.store.interface import ServerIdentity, StoreSettings
from api.responses.store.schema import CREATE_INDEXES, CREATE_TABLE
from api.responses.store.sql_store import SqlResponsesStore

_NOW = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"
_SCHEMA_LOCK = 0x5374_5273   # any fixed advisory-lock key: only structserve's start-up takes it


class PostgresResponsesStore(SqlResponsesStore):
    """The `responses` table in the PostgreSQL database at `url`."""

    def __init__(self, url: str, identity: ServerIdentity, settings: StoreSettings) -> None:
        """Connect and create the table and its indexes if missing; raises StoreUnavailable."""
        super().__init__(identity, settings, _NOW, "%s")
        self.url = url
        try:
            self._conn = self._connect()
            with self._conn.transaction():
                self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                self._conn.execute(CREATE_TABLE)
                for statement in CREATE_INDEXES:
                    self._conn.execute(statement)
        except psycopg.Error as exc:
            self._worker.shutdown()
            raise StoreUnavailable(url, exc) from exc

    def _connect(self) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True, connect_timeout=10,
                               application_name=f"structserve {self.server_id}"[:63])

    def _connection(self) -> psycopg.Connection:
        if self._conn.closed or self._conn.broken:
            self._conn = self._connect()
        return self._conn

    def _close_connection(self) -> None:
        self._conn.close()

"""`open_store`: the backend named by a `--responses-db` value."""

from __future__ import annotations

from api.responses.store.interface import ResponsesStore, ServerIdentity, StoreSettings

_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def open_store(location: str, identity: ServerIdentity, settings: StoreSettings) -> ResponsesStore:
    """A PostgreSQL store for a `postgresql://` (or `postgres://`) URI, else the SQLite file at
    `location` (`:memory:` allowed). Raises StoreUnavailable (with the backend's error as its
    cause) when it cannot be opened."""
    if location.startswith(_POSTGRES_SCHEMES):
        from api.responses.store.postgres import PostgresResponsesStore  # psycopg only when used

        return PostgresResponsesStore(location, identity, settings)
    from api.responses.store.sqlite import SqliteResponsesStore

    return SqliteResponsesStore(location, identity, settings)

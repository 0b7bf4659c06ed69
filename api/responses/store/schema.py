"""The `responses` table and every statement on it, written once for SQLite and PostgreSQL.

Statements use `?` placeholders and `{now}` for the current time in epoch seconds; a backend
turns them into its own dialect with `Statements.for_dialect` (PostgreSQL's psycopg wants `%s`,
and each database reads its own clock, so servers on several hosts agree on lease times).
Both databases support what is used: `INSERT ... ON CONFLICT DO UPDATE ... WHERE`, `RETURNING`
(SQLite >= 3.35) and `WITH RECURSIVE`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# (name, type and default): booleans are 0/1 integers and times epoch seconds in both databases.
COLUMNS = (
    ("id", "TEXT PRIMARY KEY"),
    ("status", "TEXT NOT NULL"),
    ("background", "INTEGER NOT NULL"),
    ("previous_response_id", "TEXT"),
    ("response", "TEXT NOT NULL"),
    ("input_items", "TEXT NOT NULL"),
    ("owner", "TEXT"),                # server id that created (and runs) the response
    ("owner_name", "TEXT"),           # that server's stable name (host:port)
    ("lease_expires_at", "DOUBLE PRECISION"),
    ("cancel_requested", "INTEGER NOT NULL DEFAULT 0"),
    ("deleted", "INTEGER NOT NULL DEFAULT 0"),   # 1: a tombstone (content cleared)
    ("created_at", "DOUBLE PRECISION NOT NULL DEFAULT 0"),
)
CREATE_TABLE = "CREATE TABLE IF NOT EXISTS responses (" + ", ".join(f"{n} {t}" for n, t in COLUMNS) + ")"
CREATE_INDEXES = (
    "CREATE INDEX IF NOT EXISTS responses_unfinished ON responses (status, lease_expires_at)",
    "CREATE INDEX IF NOT EXISTS responses_created ON responses (created_at)",
)
MAX_CHAIN = 10_000   # responses followed by `history` (a guard against cycles in a corrupt store)

_UNFINISHED = "status IN ('queued', 'in_progress') AND deleted = 0"
_ROW = "id, status, background, previous_response_id, response, input_items, owner, cancel_requested"


@dataclass(frozen=True, slots=True)
class Statements:
    """The SQL text of each store operation (see `ResponsesStore` for what each does)."""

    put: str = (
        "INSERT INTO responses (id, status, background, previous_response_id, response, input_items, "
        "owner, owner_name, lease_expires_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, {now} + ?, {now}) "
        "ON CONFLICT (id) DO UPDATE SET status = excluded.status, response = excluded.response, "
        "input_items = excluded.input_items, lease_expires_at = excluded.lease_expires_at "
        "WHERE responses.deleted = 0 AND responses.status NOT IN ('completed', 'incomplete', 'failed', "
        "'cancelled') AND (responses.owner IS NULL OR responses.owner = excluded.owner)"
    )
    get: str = f"SELECT {_ROW} FROM responses WHERE id = ? AND deleted = 0"
    delete: str = (
        "UPDATE responses SET deleted = 1, status = 'deleted', response = '{}', input_items = '[]', "
        "lease_expires_at = NULL, created_at = {now} WHERE id = ? AND deleted = 0"
    )
    history: str = (
        "WITH RECURSIVE chain (id, previous_response_id, response, input_items, depth) AS ("
        "SELECT id, previous_response_id, response, input_items, 0 FROM responses "
        "WHERE id = ? AND deleted = 0 "
        "UNION ALL SELECT r.id, r.previous_response_id, r.response, r.input_items, c.depth + 1 "
        "FROM responses r JOIN chain c ON r.id = c.previous_response_id "
        "WHERE r.deleted = 0 AND c.depth < ?) "
        "SELECT id, response, input_items FROM chain ORDER BY depth DESC"
    )
    owner_of: str = "SELECT owner FROM responses WHERE id = ? AND deleted = 0"
    flag_cancel: str = (
        f"UPDATE responses SET cancel_requested = 1 WHERE id = ? AND background = 1 AND {_UNFINISHED}"
    )
    renew: str = (
        "UPDATE responses SET lease_expires_at = {now} + ? "
        f"WHERE owner = ? AND {_UNFINISHED} AND id IN ({{ids}})"
    )
    must_stop: str = "SELECT id FROM responses WHERE (deleted = 1 OR cancel_requested = 1) AND id IN ({ids})"
    # An unfinished response nobody runs: selected, then ended by id with the same condition again,
    # so a status its owner stored meanwhile is never overwritten.
    abandoned: str = (
        f"{_UNFINISHED} AND (lease_expires_at IS NULL "
        "OR (owner_name = ? AND owner <> ? AND lease_expires_at <= {now}) "
        "OR lease_expires_at <= {now} - ?)"
    )
    lease_expired: str = (
        f"{_UNFINISHED} AND id = ? AND (lease_expires_at IS NULL OR lease_expires_at <= {{now}})"
    )
    select_where: str = "SELECT id, response FROM responses WHERE {where}"
    end: str = (
        "UPDATE responses SET status = ?, response = ?, lease_expires_at = NULL WHERE id = ? AND {where}"
    )
    release: str = f"UPDATE responses SET lease_expires_at = {{now}} WHERE owner = ? AND {_UNFINISHED}"
    remove_expired: str = (
        "DELETE FROM responses WHERE created_at < {now} - ? "
        "AND status NOT IN ('queued', 'in_progress')"
    )

    def for_dialect(self, now: str, placeholder: str) -> Statements:
        """These statements with `{now}` replaced by the SQL expression `now` (epoch seconds) and
        each `?` by `placeholder`. `{ids}` and `{where}` stay for the caller to fill."""
        converted = {}
        for field in fields(self):
            text = getattr(self, field.name).replace("{now}", now).replace("?", placeholder)
            converted[field.name] = text
        return Statements(**converted)

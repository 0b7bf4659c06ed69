"""Which replica owns a stored response: its rank, written into the response id.

A replica of rank k names its responses `resp_r{k}_<32 hex>` (`ServerConfig.response_id_prefix`),
and keeps them in its own store file (`replica_responses_db`), which the replica restarted in its
place (Serve gives it the same rank) opens again. The router reads the rank back from a
`previous_response_id` or a `/v1/responses/{id}` path, with no store lookup. Ids of the single
server (`resp_<hex>`) name no owner.
"""

from __future__ import annotations

import re
from pathlib import Path

from api.responses.store.sqlite import MEMORY

_OWNED_ID = re.compile(r"resp_r([0-9]{1,6})_")
_RESPONSE_PATH = re.compile(r"/v1/responses/([^/]+)(?:/cancel|/input_items)?/?")


def response_id_prefix(rank: int) -> str:
    """The prefix of every response id the replica of `rank` (>= 0) makes: "resp_r{rank}_"."""
    return f"resp_r{rank}_"


def owner_rank(response_id: str | None) -> int | None:
    """The rank written into a response id by `response_id_prefix`; None for any other id or None."""
    if not response_id:
        return None
    match = _OWNED_ID.match(response_id)
    return int(match.group(1)) if match else None


def path_response_id(path: str) -> str | None:
    """The `{id}` of GET/DELETE /v1/responses/{id}, GET .../input_items and POST .../cancel; else None."""
    match = _RESPONSE_PATH.fullmatch(path)
    return match.group(1) if match else None


def replica_responses_db(responses_db: str, rank: int) -> str:
    """The store file of the replica of `rank`: "data/responses.sqlite3" -> "<abs>/data/responses.r0.sqlite3"
    (absolute: a Ray worker's working directory is not the CLI's); ":memory:" stays in memory, and a
    database URL ("postgresql://...", a store every replica shares) stays as it is."""
    if responses_db == MEMORY or "://" in responses_db:
        return responses_db
    path = Path(responses_db).expanduser().resolve()
    return str(path.with_name(f"{path.stem}.r{rank}{path.suffix}"))

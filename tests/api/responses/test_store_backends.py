"""The Responses store interface on both backends (SQLite file, real PostgreSQL server): rows,
the previous_response_id chain, owners and leases, the cancel flag, deletes that stay deleted,
retention, and several servers (stores with their own identities) on one location."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from api.responses.store import (
    ResponsesStore, ServerIdentity, StoredResponse, StoreSettings, StoreUnavailable, open_store,
)

pytestmark = pytest.mark.anyio
StoreFactory = Callable[..., ResponsesStore]


@pytest.fixture(params=["sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store location: a SQLite file, or a new database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "responses.sqlite3")
    server = request.getfixturevalue("postgres")
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.url_of(name)


@pytest.fixture
def open_server(location: str) -> Iterator[StoreFactory]:
    """open_server(name, **settings): a store on `location` as a new server process named `name`
    (a fresh server id each call); every store opened is closed after the test."""
    opened: list[ResponsesStore] = []

    def make(name: str = "host:1", **settings: float) -> ResponsesStore:
        store = open_store(location, ServerIdentity.new(name), StoreSettings(**settings))
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()   # a second close does nothing


def row(response_id: str, status: str = "completed", background: bool = False,
        previous: str | None = None, text: str = "") -> StoredResponse:
    """A row whose response JSON has `status` and one output message with `text`."""
    output = [{"type": "message", "content": [{"type": "output_text", "text": text}]}] if text else []
    response = {"id": response_id, "status": status, "output": output}
    items = [{"type": "message", "role": "user", "content": f"question {response_id}"}]
    return StoredResponse(response_id, status, background, previous, json.dumps(response), json.dumps(items))


async def test_put_get_delete_and_delete_stays_deleted(open_server: StoreFactory) -> None:
    store = open_server()
    assert await store.put(row("r1", text="hi"))
    found = await store.get("r1")
    assert found is not None and found.status == "completed"
    assert found.output_items()[0]["content"][0]["text"] == "hi" and found.input_items()[0]["role"] == "user"
    assert found.owner == store.server_id and found.cancel_requested is False
    assert await store.get("r_missing") is None
    assert await store.delete("r1") is True
    assert await store.get("r1") is None and await store.delete("r1") is False
    assert await store.put(row("r1", text="back")) is False   # a tombstone: never resurrected
    assert await store.get("r1") is None and await store.history("r1") is None


async def test_history_is_the_chain_oldest_first_to_a_deleted_ancestor(open_server: StoreFactory) -> None:
    store = open_server()
    for i in range(1, 4):
        await store.put(row(f"r{i}", previous=f"r{i - 1}" if i > 1 else None, text=f"answer {i}"))
    texts = [item.get("content") for item in await store.history("r3") or []]
    assert texts == ["question r1", [{"type": "output_text", "text": "answer 1"}], "question r2",
                     [{"type": "output_text", "text": "answer 2"}], "question r3",
                     [{"type": "output_text", "text": "answer 3"}]]
    await store.delete("r1")
    assert [item.get("content") for item in await store.history("r3") or []][0] == "question r2"
    assert await store.history("r_missing") is None
    for i in range(4, 400):   # a long chain is still one query
        await store.put(row(f"r{i}", previous=f"r{i - 1}"))
    # r2 and r3: a question and an answer each; r4..r399: a question each
    assert len(await store.history("r399") or []) == 2 * 2 + 396


async def test_owner_of_and_only_the_owner_writes(open_server: StoreFactory) -> None:
    a, b = open_server("host:1"), open_server("host:2")
    assert a.server_id != b.server_id and a.server_id.startswith("host:1/")
    await a.put(row("bg", "queued", background=True))
    await a.put(row("fg", "completed"))
    assert await a.owner_of("bg") == a.server_id and await b.owner_of("bg") == a.server_id
    assert await b.owner_of("fg") == a.server_id and await b.owner_of("nope") is None
    assert await b.put(row("fg", "completed")) is False   # finished, and a's
    assert await b.put(row("bg", "completed", background=True)) is False   # not b's response
    assert await a.put(row("bg", "in_progress", background=True))
    assert await a.put(row("bg", "completed", background=True, text="done"))
    assert await a.put(row("bg", "in_progress", background=True)) is False  # finished is final
    stored = await b.get("bg")
    assert stored is not None and stored.status == "completed" and stored.owner == a.server_id


async def test_a_renewed_lease_keeps_its_response_alive(open_server: StoreFactory) -> None:
    a, b = open_server("host:1", lease_s=0.3), open_server("host:2", lease_s=0.3, lease_grace_s=0.1)
    await a.put(row("bg", "in_progress", background=True))
    for _ in range(8):
        await asyncio.sleep(0.1)
        assert await a.renew_leases(["bg"]) == set()
        assert await b.fail_expired_leases() == 0
    stored = await b.get("bg")
    assert stored is not None and stored.status == "in_progress"


async def test_expired_leases_fail_only_when_their_owner_is_gone(open_server: StoreFactory) -> None:
    earlier = open_server("host:1", lease_s=0.2)
    for response_id in ("mine", "other"):
        await earlier.put(row(response_id, "in_progress", background=True))
    restarted = open_server("host:1", lease_s=0.2, lease_grace_s=60)
    stranger = open_server("host:2", lease_s=0.2, lease_grace_s=60)
    assert await restarted.fail_expired_leases() == 0   # the lease still runs
    await asyncio.sleep(0.3)
    assert await stranger.fail_expired_leases() == 0    # expired, but within the grace period
    assert await restarted.fail_expired_leases() == 2   # an earlier process of its own
    stored = await stranger.get("mine")
    assert stored is not None and stored.status == "failed"
    response = json.loads(stored.response_json)
    assert response["status"] == "failed" and response["error"]["code"] == "server_error"
    assert await earlier.put(row("mine", "completed", background=True)) is False


async def test_any_server_fails_a_lease_expired_past_the_grace_period(open_server: StoreFactory) -> None:
    gone = open_server("host:1", lease_s=0.1)
    await gone.put(row("bg", "queued", background=True))
    stranger = open_server("host:2", lease_s=0.1, lease_grace_s=0.2)
    await asyncio.sleep(0.4)
    assert await stranger.fail_expired_leases() == 1
    stored = await stranger.get("bg")
    assert stored is not None and stored.status == "failed"


async def test_cancel_flag_reaches_the_owner(open_server: StoreFactory) -> None:
    a, b = open_server("host:1"), open_server("host:2")
    await a.put(row("bg", "in_progress", background=True))
    await a.put(row("fg", "completed"))
    assert await a.renew_leases(["bg"]) == set()
    flagged = await b.request_cancel("bg")
    assert flagged is not None and flagged.status == "in_progress" and flagged.cancel_requested
    assert await a.renew_leases(["bg"]) == {"bg"}
    assert await a.put(row("bg", "cancelled", background=True))
    stored = await b.get("bg")
    assert stored is not None and stored.status == "cancelled"
    unflagged = await b.request_cancel("fg")   # not a background response: nothing to flag
    assert unflagged is not None and not unflagged.cancel_requested and unflagged.status == "completed"
    assert await b.request_cancel("nope") is None


async def test_cancel_of_an_expired_lease_is_stored_by_the_canceller(open_server: StoreFactory) -> None:
    a, b = open_server("host:1", lease_s=0.1), open_server("host:2")
    await a.put(row("bg", "in_progress", background=True))
    await asyncio.sleep(0.2)
    cancelled = await b.request_cancel("bg")
    assert cancelled is not None and cancelled.status == "cancelled"
    assert json.loads(cancelled.response_json)["status"] == "cancelled"
    assert await a.put(row("bg", "completed", background=True)) is False


async def test_delete_elsewhere_stops_the_owner_and_stays_deleted(open_server: StoreFactory) -> None:
    a, b = open_server("host:1"), open_server("host:2")
    await a.put(row("bg", "in_progress", background=True))
    assert await b.delete("bg") is True
    assert await a.renew_leases(["bg"]) == {"bg"}
    assert await a.put(row("bg", "cancelled", background=True)) is False
    assert await a.get("bg") is None and await a.owner_of("bg") is None


async def test_retention_removes_old_finished_rows_and_tombstones(open_server: StoreFactory) -> None:
    store = open_server(retention_s=0.3)
    keep_all = open_server("host:2")
    for response_id in ("old", "gone"):
        await store.put(row(response_id))
    await store.put(row("running", "in_progress", background=True))
    await store.delete("gone")
    await asyncio.sleep(0.4)
    await store.put(row("new"))
    assert await keep_all.remove_expired() == 0   # no retention set: nothing removed
    assert await store.remove_expired() == 2      # "old" and the tombstone of "gone"
    assert [await store.get(i) is not None for i in ("old", "running", "new")] == [False, True, True]
    assert await store.put(row("gone")) is True   # the tombstone is gone too, after retention


async def test_closing_gives_up_the_leases(open_server: StoreFactory) -> None:
    first = open_server("host:1")
    await first.put(row("bg", "queued", background=True))
    first.close()
    restarted = open_server("host:1", lease_grace_s=60)
    assert await restarted.fail_expired_leases() == 1
    stored = await restarted.get("bg")
    assert stored is not None and stored.status == "failed"


async def test_concurrent_writers_on_two_connections_lose_nothing(open_server: StoreFactory) -> None:
    a, b = open_server("host:1"), open_server("host:2")
    rows = [row(f"r{i}") for i in range(200)]
    await asyncio.gather(*((a if i % 2 else b).put(r) for i, r in enumerate(rows)))
    assert all([await a.get(r.id) is not None for r in rows])


async def test_a_file_of_the_earlier_schema_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE responses (id TEXT PRIMARY KEY, status TEXT NOT NULL, "
                 "background INTEGER NOT NULL, previous_response_id TEXT, response TEXT NOT NULL, "
                 "input_items TEXT NOT NULL)")
    conn.execute("INSERT INTO responses VALUES ('q', 'queued', 1, NULL, '{\"status\": \"queued\"}', '[]')")
    conn.commit()
    conn.close()
    store = open_store(str(path), ServerIdentity.new("host:1"), StoreSettings())
    try:
        assert await store.fail_expired_leases() == 1   # no lease: left by an earlier server
        stored = await store.get("q")
        assert stored is not None and stored.status == "failed"
    finally:
        store.close()


def test_a_store_that_cannot_be_opened_is_a_clear_error(tmp_path: Path) -> None:
    from benchmarks.server_process import free_port

    url = f"postgresql://someone:secret@127.0.0.1:{free_port()}/nothing"   # nobody listens there
    masked = "cannot open the Responses store at postgresql://someone:\\*\\*\\*@"
    with pytest.raises(StoreUnavailable, match=masked) as info:
        open_store(url, ServerIdentity.new("host:1"), StoreSettings())
    assert "secret" not in str(info.value) and isinstance(info.value.__cause__, psycopg.OperationalError)
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreUnavailable, match="cannot open the Responses store at .*file/sub"):
        open_store(str(tmp_path / "file" / "sub" / "r.sqlite3"), ServerIdentity.new("h:1"), StoreSettings())


def test_settings_are_checked() -> None:
    for bad in ({"lease_s": 0}, {"retention_s": -1}, {"lease_grace_s": -1}):
        with pytest.raises(ValueError):
            StoreSettings(**bad)

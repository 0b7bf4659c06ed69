"""Stored responses through the API: retrieve, delete, input_items paging, previous_response_id
chains, restarts (a new app on the same SQLite file), concurrent writers, background responses, and
two servers (apps) on one file cancelling and deleting each other's background responses. The
store itself, on both backends: test_store_backends.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, sdk_client
from fastapi import FastAPI
from responses_support import GET_WEATHER, call_text, play, prompt_of

from api.app import create_app
from api.cli.serve import build_configs, build_parser
from api.config import ServerConfig
from api.responses.cancel import cancel_background

pytestmark = pytest.mark.anyio


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=8192)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sub" / "responses.sqlite3"


@pytest.fixture
def server_config(db_path: Path) -> ServerConfig:
    return ServerConfig(sse_ping_interval_s=0, responses_db=str(db_path))


async def post(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    r = await client.post("/v1/responses", json={"model": "fake-model", **fields})
    assert r.status_code == 200, r.text
    return r.json()


async def test_retrieve_and_delete(client: httpx.AsyncClient, db_path: Path) -> None:
    created = await post(client, input="x")
    assert db_path.exists()
    r = await client.get(f"/v1/responses/{created['id']}")
    assert r.status_code == 200 and r.json() == created
    r = await client.delete(f"/v1/responses/{created['id']}")
    assert r.json() == {"id": created["id"], "object": "response.deleted", "deleted": True}
    for method in ("get", "delete"):
        r = await client.request(method.upper(), f"/v1/responses/{created['id']}")
        assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"


async def test_store_false_is_not_stored(client: httpx.AsyncClient) -> None:
    created = await post(client, input="x", store=False)
    assert created["store"] is False
    assert (await client.get(f"/v1/responses/{created['id']}")).status_code == 404
    r = await client.post("/v1/responses", json={"input": "y", "previous_response_id": created["id"]})
    error = r.json()["error"]
    assert r.status_code == 404 and error["code"] == "previous_response_not_found"
    assert error["param"] == "previous_response_id"


async def test_previous_response_chain_rebuilds_the_conversation(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    play(engine, "first answer", "second answer", "third answer")
    one = await post(client, input="question one", instructions="only for turn one")
    two = await post(client, input="question two", previous_response_id=one["id"])
    await post(client, input=[{"role": "user", "content": "question three"}], previous_response_id=two["id"])
    prompt = prompt_of(engine)
    order = ["question one", "first answer", "question two", "second answer", "question three"]
    positions = [prompt.index(text) for text in order]
    assert positions == sorted(positions)
    assert "only for turn one" not in prompt  # instructions are not carried over
    assert two["previous_response_id"] == one["id"]


async def test_tool_loop_through_previous_response_id(app: FastAPI, engine: FakeEngine) -> None:
    play(engine, call_text("get_weather", {"city": "Paris"}), "It is sunny in Paris.")
    async with sdk_client(app) as client:
        first = await client.responses.create(
            model="fake-model", input="Weather in Paris?", tools=[GET_WEATHER], tool_choice="required"
        )
        [call] = first.output
        second = await client.responses.create(
            model="fake-model",
            previous_response_id=first.id,
            tools=[GET_WEATHER],
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "sunny"}'}],
        )
        assert second.output_text == "It is sunny in Paris."
        items = await client.responses.input_items.list(second.id)
    assert '{"sky": "sunny"}' in prompt_of(engine) and "Paris" in prompt_of(engine)
    assert [item.type for item in items.data] == ["function_call_output"]
    assert items.data[0].call_id == call.call_id and items.data[0].id.startswith("fco_")


async def test_input_items_paging(app: FastAPI, client: httpx.AsyncClient) -> None:
    created = await post(
        client, input=[{"role": "user", "content": f"m{i}", "id": f"msg_{i}"} for i in range(5)]
    )
    url = f"/v1/responses/{created['id']}/input_items"
    page = (await client.get(url, params={"order": "asc", "limit": 2})).json()
    assert page["object"] == "list" and [i["id"] for i in page["data"]] == ["msg_0", "msg_1"]
    assert (page["first_id"], page["last_id"], page["has_more"]) == ("msg_0", "msg_1", True)
    page = (await client.get(url, params={"order": "asc", "limit": 2, "after": "msg_3"})).json()
    assert [i["id"] for i in page["data"]] == ["msg_4"] and page["has_more"] is False
    page = (await client.get(url)).json()  # default: desc, 20
    assert [i["id"] for i in page["data"]] == [f"msg_{i}" for i in (4, 3, 2, 1, 0)]
    assert page["data"][0] == {
        "id": "msg_4",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [{"type": "input_text", "text": "m4"}],
    }
    for params, param in [({"after": "nope"}, "after"), ({"limit": 0}, "limit"), ({"order": "up"}, "order")]:
        r = await client.get(url, params=params)
        assert r.status_code == 400 and param in (r.json()["error"]["param"] or ""), r.text
    assert (await client.get("/v1/responses/resp_nope/input_items")).status_code == 404
    async with sdk_client(app) as sdk:
        ids = [item.id async for item in sdk.responses.input_items.list(created["id"], limit=2, order="asc")]
    assert ids == [f"msg_{i}" for i in range(5)]


async def test_restart_keeps_stored_responses(engine: FakeEngine, server_config: ServerConfig) -> None:
    first_app = create_app(engine, server_config)
    async with _client(first_app) as client:
        created = await post(client, input="remember me")
    first_app.state.responses.store.close()
    second_engine = FakeEngine(max_model_len=8192)
    async with _client(create_app(second_engine, server_config)) as client:
        assert (await client.get(f"/v1/responses/{created['id']}")).json() == created
        await post(client, input="and now?", previous_response_id=created["id"])
    assert "remember me" in prompt_of(second_engine)


async def test_concurrent_requests_lose_nothing(client: httpx.AsyncClient) -> None:
    created = await asyncio.gather(*(post(client, input=f"q{i}") for i in range(24)))
    for response in created:
        assert (await client.get(f"/v1/responses/{response['id']}")).status_code == 200


async def test_two_servers_on_one_file_cancel_and_delete_each_others_background_responses(
    engine: FakeEngine, server_config: ServerConfig
) -> None:
    """Two apps (two servers) on one SQLite file: a background response that A runs is cancelled
    through B (A's lease watcher picks up the flag and aborts its engine request), another is
    deleted through B and stays deleted."""
    engine.step_delay_s = 0.05
    engine.script = "x" * 200   # 10 s of generation: both are still running when B acts
    app_a = create_app(engine, server_config)
    app_b = create_app(FakeEngine(max_model_len=8192), server_config)
    try:
        async with _client(app_a) as a, _client(app_b) as b:
            first = await post(a, input="x", background=True)
            second = await post(a, input="y", background=True)
            await _poll_until(b, first["id"], {"in_progress"})
            assert app_a.state.responses.store.server_id != app_b.state.responses.store.server_id
            r = await b.post(f"/v1/responses/{first['id']}/cancel")
            assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
            assert engine.aborted == [first["id"]]
            assert (await b.delete(f"/v1/responses/{second['id']}")).status_code == 200
            for _ in range(250):     # A's lease watcher, then its task's own ending: 5 s at most
                if second["id"] in engine.aborted and app_a.state.responses.background.num_running == 0:
                    break
                await asyncio.sleep(0.02)
            assert engine.aborted == [first["id"], second["id"]]   # A stopped generating it
            assert app_a.state.responses.background.num_running == 0
            for client in (a, b):
                assert (await client.get(f"/v1/responses/{second['id']}")).status_code == 404
    finally:
        app_a.state.responses.store.close()
        app_b.state.responses.store.close()


async def test_a_cancel_the_owner_has_not_read_yet_is_answered_as_it_stands(
    engine: FakeEngine, server_config: ServerConfig
) -> None:
    """B cancels A's response while A's lease watcher sleeps: after waiting, B answers with the
    stored status (still in progress, the cancel request recorded), and A then cancels it."""
    engine.step_delay_s = 0.05
    engine.script = "x" * 200
    app_a = create_app(engine, server_config)
    app_b = create_app(FakeEngine(max_model_len=8192), server_config)
    app_a.state.responses.background.poll_s = 1.0
    try:
        async with _client(app_a) as a, _client(app_b) as b:
            job = await post(a, input="x", background=True, max_output_tokens=200)
            await _poll_until(b, job["id"], {"in_progress"})
            state_b = app_b.state.responses
            stored = await state_b.store.get(job["id"])
            answered = await cancel_background(state_b, stored, wait_s=0.2)
            assert answered is not None and answered.status == "in_progress" and answered.cancel_requested
            assert (await _poll_until(b, job["id"], {"cancelled"}))[-1] == "cancelled"
            assert engine.aborted == [job["id"]]
    finally:
        app_a.state.responses.store.close()
        app_b.state.responses.store.close()


async def test_the_lifespan_applies_the_retention_period(engine: FakeEngine, db_path: Path) -> None:
    config = ServerConfig(responses_db=str(db_path), responses_retention_s=0.3, server_name="replica-1")
    app = create_app(engine, config)
    assert app.state.responses.store.server_id.startswith("replica-1/")
    async with _client(app) as client:
        old = await post(client, input="old")
        await asyncio.sleep(0.4)
        new = await post(client, input="new")
        async with app.router.lifespan_context(app):   # its first upkeep round runs at start-up
            for _ in range(100):
                if (await client.get(f"/v1/responses/{old['id']}")).status_code == 404:
                    break
                await asyncio.sleep(0.02)
            assert (await client.get(f"/v1/responses/{old['id']}")).status_code == 404
            assert (await client.get(f"/v1/responses/{new['id']}")).status_code == 200


async def test_memory_store(engine: FakeEngine) -> None:
    async with _client(create_app(engine, ServerConfig(responses_db=":memory:"))) as client:
        created = await post(client, input="x")
        assert (await client.get(f"/v1/responses/{created['id']}")).status_code == 200


async def test_background_runs_to_completion(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.step_delay_s = 0.01
    queued = await post(client, input="x", background=True)
    assert queued["status"] == "queued" and queued["background"] is True and queued["output"] == []
    seen = await _poll_until(client, queued["id"], {"completed"})
    assert seen[0] in ("queued", "in_progress") and "in_progress" in seen
    final = (await client.get(f"/v1/responses/{queued['id']}")).json()
    assert (
        final["output"][0]["content"][0]["text"] == "Hello world!" and final["usage"]["output_tokens"] == 12
    )
    r = await client.post(f"/v1/responses/{queued['id']}/cancel")  # finished: returned unchanged
    assert r.status_code == 200 and r.json()["status"] == "completed"


async def test_background_cancel_aborts_the_engine_request(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.step_delay_s = 0.05
    queued = await post(client, input="x", background=True)
    await _poll_until(client, queued["id"], {"in_progress"})
    r = await client.post(f"/v1/responses/{queued['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert (await client.get(f"/v1/responses/{queued['id']}")).json()["status"] == "cancelled"
    assert engine.aborted == [queued["id"]]
    foreground = await post(client, input="x")
    r = await client.post(f"/v1/responses/{foreground['id']}/cancel")
    assert r.status_code == 400


async def test_shutdown_cancels_background_responses(
    app: FastAPI, client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.step_delay_s = 0.05
    queued = await post(client, input="x", background=True)
    await _poll_until(client, queued["id"], {"in_progress"})
    await app.state.responses.background.shutdown()
    assert (await client.get(f"/v1/responses/{queued['id']}")).json()["status"] == "cancelled"


def test_cli_flags() -> None:
    args = build_parser().parse_args(["serve", "--responses-db", "/tmp/r.db", "--responses-retention", "12h"])
    assert build_configs(args, {})[1].responses_db == "/tmp/r.db"
    assert build_configs(args, {})[1].responses_retention_s == 12 * 3600
    args = build_parser().parse_args(["serve"])
    config = build_configs(args, {})[1]
    assert config.responses_db == "data/responses.sqlite3" and config.responses_retention_s is None
    for value, seconds in [("90", 90), ("1.5m", 90), ("7d", 7 * 86400), ("2w", 14 * 86400)]:
        assert build_parser().parse_args(["serve", "--responses-retention", value]).responses_retention == seconds
    for bad in ("0", "-1", "soon", "3y"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--responses-retention", bad])


async def _poll_until(client: httpx.AsyncClient, response_id: str, wanted: set[str]) -> list[str]:
    seen: list[str] = []
    for _ in range(500):
        status = (await client.get(f"/v1/responses/{response_id}")).json()["status"]
        if not seen or seen[-1] != status:
            seen.append(status)
        if status in wanted:
            return seen
        await asyncio.sleep(0.01)
    raise AssertionError(f"status stayed {seen}")


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")

"""Access flags end to end through the CLI's configs: STRUCTSERVE_API_KEY, --protect-metrics, CORS."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import httpx
import pytest
from api_support import FakeEngine, chat_body

from api.cli.access import parse_list
from api.app import create_app
from api.cli.serve import build_configs, build_parser

pytestmark = pytest.mark.anyio

AUTH = {"Authorization": "Bearer k3y"}
ORIGIN = "https://ui.example"
PREFLIGHT = {
    "Origin": ORIGIN,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization,content-type",
}

Connect = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def serve(engine: FakeEngine) -> Connect:
    """`serve(*flags, env={...})`: a client of the app built from `structserve serve <flags>`."""

    @asynccontextmanager
    async def connect(*flags: str, env: dict[str, str] | None = None) -> AsyncIterator[httpx.AsyncClient]:
        args = build_parser().parse_args(["serve", "--responses-db", ":memory:", *flags])
        _, server_config = build_configs(args, env or {})
        app = create_app(engine, server_config)
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                yield c
        finally:
            app.state.responses.store.close()

    return connect


async def test_api_key_from_the_environment_guards_v1(serve: Connect) -> None:
    async with serve(env={"STRUCTSERVE_API_KEY": "k3y"}) as client:
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 401
        assert (await client.post("/v1/chat/completions", json=chat_body(), headers=AUTH)).status_code == 200
        assert (await client.get("/metrics")).status_code == 200      # open without --protect-metrics
        assert (await client.get("/health")).status_code == 200


async def test_protect_metrics_needs_the_key_but_health_stays_open(serve: Connect) -> None:
    async with serve("--api-key", "k3y", "--protect-metrics") as client:
        denied = await client.get("/metrics")
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        assert (await client.get("/metrics", headers={"Authorization": "Bearer nope"})).status_code == 401
        allowed = await client.get("/metrics", headers=AUTH)
        assert allowed.status_code == 200 and "structserve:num_requests_running" in allowed.text
        assert (await client.get("/health")).status_code == 200


def test_protect_metrics_without_a_key_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="protect-metrics"):
        build_configs(build_parser().parse_args(["serve", "--protect-metrics"]), {})


async def test_cors_is_off_by_default(serve: Connect) -> None:
    async with serve() as client:
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        assert "access-control-allow-origin" not in preflight.headers
        simple = await client.get("/v1/models", headers={"Origin": ORIGIN})
        assert "access-control-allow-origin" not in simple.headers


async def test_cors_when_configured(serve: Connect) -> None:
    flags = ("--api-key", "k3y", "--allowed-origins", f'["{ORIGIN}"]', "--allowed-methods", "GET,POST",
             "--allow-credentials")
    async with serve(*flags) as client:
        preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
        assert preflight.status_code == 200                        # answered without the API key
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert preflight.headers["access-control-allow-credentials"] == "true"
        assert "POST" in preflight.headers["access-control-allow-methods"]
        other = await client.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        simple = await client.get("/v1/models", headers={"Origin": ORIGIN, **AUTH})
        assert simple.status_code == 200 and simple.headers["access-control-allow-origin"] == ORIGIN


def test_list_flags_take_json_or_commas() -> None:
    assert parse_list('["https://a", "https://b"]') == ("https://a", "https://b")
    assert parse_list("https://a, https://b") == ("https://a", "https://b")
    assert parse_list("*") == ("*",)
    with pytest.raises(argparse.ArgumentTypeError, match="list of strings"):
        parse_list("[1]")

"""Fixtures: a FakeEngine, the app around it, and an httpx client over ASGI."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from api_support import FakeEngine
from fastapi import FastAPI

from api.app import create_app
from api.config import ServerConfig


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def server_config() -> ServerConfig:
    return ServerConfig(sse_ping_interval_s=0)


@pytest.fixture
def app(engine: FakeEngine, server_config: ServerConfig) -> Iterator[FastAPI]:
    app = create_app(engine, server_config)
    yield app
    app.state.responses.store.close()


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c

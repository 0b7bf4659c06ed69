"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from api.config import ServerConfig
from api.http.context import EngineClient, ServerContext
from api.http.draining import DrainMiddleware, DrainState
from api.http.errors import install_error_handlers
from api.observability.metrics import ServingMetrics
from api.http.middleware import RequestIdMiddleware
from api.http.openapi import install_openapi
from api.observability.request_log import RequestLogMiddleware
from api.responses.state import ResponsesState
from api.responses.store import ServerIdentity, StoreSettings, open_store
from api.admin import health, lora, metrics, models, tokenize
from api.chat import router as chat
from api.completions import router as completions
from api.messages import router as messages
from api.responses import router as responses


def create_app(engine: EngineClient, server_config: ServerConfig) -> FastAPI:
    """Build the app around a started engine: OpenAI routes and Anthropic's /v1/messages under /v1
    (API key when configured),
    /tokenize, /detokenize, /health, /version; OpenAI error bodies; x-request-id on every response;
    503 for new requests once `app.state.drain` drains (`api/http/shutdown.py`); /metrics from
    `app.state.metrics` (`api/observability/metrics.py`); one log line per generation request
    (`api/observability/request_log.py`);
    CORS only when `server_config.allowed_origins` is set; /openapi.json with the request bodies
    and error objects the routes really use (`api/http/openapi.py`).

    Opens the responses store (`server_config.responses_db`, a SQLite file or a PostgreSQL URI;
    raises StoreUnavailable when it cannot) under a server id made now
    (`app.state.responses.store.server_id`). The app does not own the engine: whoever started it
    shuts it down. While it serves, the lifespan runs the store's upkeep (expired leases,
    retention); at shutdown the app cancels its background responses and closes the store.
    """
    settings = StoreSettings(retention_s=server_config.responses_retention_s)
    identity = (ServerIdentity.new(server_config.server_name) if server_config.server_name
                else ServerIdentity.for_port(server_config.port))
    store = open_store(server_config.responses_db, identity, settings)
    state = ResponsesState(store=store)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        upkeep = asyncio.create_task(state.maintain(), name="responses store upkeep")
        try:
            yield
        finally:
            upkeep.cancel()
            await state.close()

    app = FastAPI(title="structserve", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.context = ServerContext(engine=engine, config=server_config)
    app.state.responses = state
    app.state.drain = DrainState()
    app.state.metrics = ServingMetrics(engine, app.state.context.served_model_names[0])
    for module in (chat, completions, responses, messages, models, tokenize, health, metrics, lora):
        app.include_router(module.router)
    install_error_handlers(app)
    install_openapi(app)
    app.add_middleware(DrainMiddleware, drain=app.state.drain)   # inside RequestIdMiddleware: 503s get an id
    app.add_middleware(RequestLogMiddleware)   # inside RequestIdMiddleware (reads its id), outside the drain
    app.add_middleware(RequestIdMiddleware)
    if server_config.allowed_origins:   # outermost: preflights are answered before anything else runs
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(server_config.allowed_origins),
            allow_methods=list(server_config.allowed_methods),
            allow_headers=list(server_config.allowed_headers),
            allow_credentials=server_config.allow_credentials,
        )
    return app

"""The FastAPI application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from api.config import ServerConfig
from api.context import EngineClient, ServerContext
from api.errors import install_error_handlers
from api.middleware import RequestIdMiddleware
from api.responses_state import ResponsesState
from api.responses_store import ResponsesStore
from api.routes import chat, completions, health, lora, metrics, models, responses, tokenize


def create_app(engine: EngineClient, server_config: ServerConfig) -> FastAPI:
    """Build the app around a started engine: OpenAI routes under /v1 (API key when configured),
    /tokenize, /detokenize, /health, /version; OpenAI error bodies; x-request-id on every response.

    Opens the responses store (`server_config.responses_db`; raises sqlite3.Error / OSError when it
    cannot). The app does not own the engine: whoever started it shuts it down. At shutdown the
    app cancels its background responses and closes the store.
    """
    state = ResponsesState(store=ResponsesStore(server_config.responses_db))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await state.close()

    app = FastAPI(title="structserve", docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.context = ServerContext(engine=engine, config=server_config)
    app.state.responses = state
    for module in (chat, completions, responses, models, tokenize, health, metrics, lora):
        app.include_router(module.router)
    install_error_handlers(app)
    app.add_middleware(RequestIdMiddleware)
    return app

"""The FastAPI application factory."""

from __future__ import annotations

from fastapi import FastAPI

from api.config import ServerConfig
from api.context import EngineClient, ServerContext
from api.errors import install_error_handlers
from api.middleware import RequestIdMiddleware
from api.routes import chat, completions, health, metrics, models, tokenize


def create_app(engine: EngineClient, server_config: ServerConfig) -> FastAPI:
    """Build the app around a started engine: OpenAI routes under /v1 (API key when configured),
    /tokenize, /detokenize, /health, /version; OpenAI error bodies; x-request-id on every response.

    The app does not own the engine: whoever started it shuts it down.
    """
    app = FastAPI(title="structserve", docs_url=None, redoc_url=None)
    app.state.context = ServerContext(engine=engine, config=server_config)
    for module in (chat, completions, models, tokenize, health, metrics):
        app.include_router(module.router)
    install_error_handlers(app)
    app.add_middleware(RequestIdMiddleware)
    return app

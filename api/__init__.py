"""FastAPI app, OpenAI protocol models, SSE streaming, CLI and error mapping."""

from api.app import create_app
from api.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]

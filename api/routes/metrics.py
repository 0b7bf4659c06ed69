"""GET /metrics: Prometheus text exposition of the engine's state."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.metrics import build_registry

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Render the registry built for this app (created on first scrape)."""
    state = request.app.state
    if getattr(state, "metrics_registry", None) is None:
        ctx = state.context
        state.metrics_registry = build_registry(ctx.engine, ctx.served_model_names[0])
    return Response(generate_latest(state.metrics_registry), media_type=CONTENT_TYPE_LATEST)

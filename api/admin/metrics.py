"""GET /metrics: Prometheus text exposition of the engine's state and the api's request metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.http.auth import require_metrics_key
from api.observability.metrics import app_metrics

router = APIRouter(dependencies=[Depends(require_metrics_key)])


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Render the app's registry (`api/observability/metrics.py`); the API key is needed with
    --protect-metrics."""
    serving = app_metrics(request)
    assert serving is not None, "create_app sets app.state.metrics"
    return Response(generate_latest(serving.registry), media_type=CONTENT_TYPE_LATEST)

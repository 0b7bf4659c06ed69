"""GET /health (200, or 503 when the engine is down) and GET /version."""

from __future__ import annotations

from importlib import metadata

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from starlette.responses import Response

from api.http.context import Context
from api.protocol.common import ErrorInfo, ErrorResponse

router = APIRouter()


@router.get("/health", response_class=Response)
async def health(context: Context) -> Response:
    """200 with an empty body while the engine runs; 503 with an error body once it has stopped."""
    if context.engine.is_healthy():
        return Response(status_code=200)
    body = ErrorResponse(
        error=ErrorInfo(message="the engine is not running", type="server_error", code="engine_dead")
    )
    return JSONResponse(body.model_dump(), status_code=503)


@router.get("/version")
async def version() -> dict[str, str]:
    """`{"version": <structserve version>}`."""
    try:
        return {"version": metadata.version("structserve")}
    except metadata.PackageNotFoundError:
        return {"version": "unknown"}

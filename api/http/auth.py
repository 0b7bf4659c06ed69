"""API-key checks: /v1/* (`--api-key`) and, with `--protect-metrics`, /metrics. /health stays open."""

from __future__ import annotations

import hmac

from fastapi import Request

from api.http.context import Context
from api.errors import AuthenticationFailed


async def require_api_key(request: Request, context: Context) -> None:
    """FastAPI dependency: with an api key configured, demand `Authorization: Bearer <key>` or
    `x-api-key: <key>` (what Anthropic's clients send); either one matching is enough.

    The comparisons are constant-time. Raises AuthenticationFailed (401).
    """
    expected = context.config.api_key
    if not expected:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    bearer = token.strip() if scheme.lower() == "bearer" else ""
    keys = [key for key in (bearer, request.headers.get("x-api-key", "").strip()) if key]
    if not any(hmac.compare_digest(key.encode(), expected.encode()) for key in keys):
        raise AuthenticationFailed(
            "Incorrect or missing API key; send 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
        )


async def require_metrics_key(request: Request, context: Context) -> None:
    """FastAPI dependency of /metrics: `require_api_key` when `protect_metrics` is set, else open.

    Raises AuthenticationFailed (401).
    """
    if context.config.protect_metrics:
        await require_api_key(request, context)

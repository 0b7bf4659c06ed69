"""The gate in front of the app while it drains for shutdown: new requests get 503, requests
already in flight are counted until they end (streams included).

Pure ASGI (like `api/http/middleware.py`) so that the count covers a streamed response up to its last
byte and `receive` reaches the routes untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import ServerShuttingDown
from api.http.errors import error_headers, error_response

OPEN_WHILE_DRAINING = frozenset({"/metrics"})
"""Paths still served while draining (and not counted): a dashboard keeps watching the drain.
/health answers 503 then, so that a load balancer stops routing here."""


@dataclass(slots=True)
class DrainState:
    """Whether the app drains, and how many HTTP requests are in flight (`app.state.drain`).

    Written only on the event loop: the middleware counts, `api/http/shutdown.py` sets `draining`.
    """

    draining: bool = False
    num_in_flight: int = 0


class DrainMiddleware:
    """Count in-flight HTTP requests in `drain`; once `drain.draining` is set, answer every new
    request (but OPEN_WHILE_DRAINING) with 503 `shutting_down` and Retry-After."""

    def __init__(self, app: ASGIApp, drain: DrainState) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http" or scope.get("path") in OPEN_WHILE_DRAINING:
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            exc = ServerShuttingDown("the server is shutting down; retry on another replica or later")
            await error_response(exc, error_headers(exc), scope.get("path"))(scope, receive, send)
            return
        self.drain.num_in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.num_in_flight -= 1

"""Pure ASGI middleware: the x-request-id header on every response, and a last-resort 500.

Pure ASGI (not BaseHTTPMiddleware) so that `receive` reaches the routes untouched: they watch it
for `http.disconnect` to abort abandoned requests.
"""

from __future__ import annotations

import logging
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.http.errors import error_response

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = b"x-request-id"
_MAX_REQUEST_ID_LEN = 128


class RequestIdMiddleware:
    """Echo the client's `x-request-id` (or a fresh one) on the response; put it in
    `request.state.request_id` for logs. An exception that escapes the app becomes a 500 OpenAI
    error body when no response has started yet (and is logged with the request id)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_request_id(scope) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER]
                message = {
                    **message,
                    "headers": [*headers, (REQUEST_ID_HEADER, request_id.encode("latin-1"))],
                }
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("request %s: unhandled error", request_id)
            if started:
                raise
            await error_response(RuntimeError("internal"), path=scope.get("path"))(scope, receive, send_with_id)


def _client_request_id(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == REQUEST_ID_HEADER:
            text: str = value.decode("latin-1").strip()
            if 0 < len(text) <= _MAX_REQUEST_ID_LEN and text.isprintable():
                return text
    return None

"""Run one `ForwardedRequest` through an ASGI app in this process and yield its response.

The engine replica calls the app of `api/app.py` directly with an ASGI scope rebuilt from the
forwarded request (ASGI 3.0 HTTP scope, https://asgi.readthedocs.io/en/latest/specs/www.html):
`receive` returns the whole body once, then blocks until the caller stops iterating (the client
went away, or Serve cancelled the call), when it returns `http.disconnect`, so the app's
disconnect handling aborts the engine request and frees its KV blocks exactly as behind uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from api.replicas.forwarded import ForwardedRequest

logger = logging.getLogger(__name__)

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]
_DISCONNECT_GRACE_S = 5.0   # how long the app gets to notice a disconnect before its task is cancelled


@dataclass(frozen=True, slots=True)
class ResponseStart:
    """The first part of a forwarded response: status code and (name, value) byte header pairs."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]


def http_scope(request: ForwardedRequest) -> dict[str, Any]:
    """The ASGI HTTP scope of a forwarded request (client and server: loopback, port 0)."""
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": request.method, "scheme": "http", "path": request.path,
        "raw_path": request.path.encode("utf-8"), "query_string": request.query_string, "root_path": "",
        "headers": [list(pair) for pair in request.headers],
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0), "state": {},
    }


async def call_app(app: ASGIApp, request: ForwardedRequest,
                   extra_headers: tuple[tuple[bytes, bytes], ...] = ()) -> AsyncIterator[ResponseStart | bytes]:
    """Yield the app's `ResponseStart` (with `extra_headers` appended), then each non-empty body
    chunk. Raises RuntimeError when the app ends without starting a response (its own exception is
    chained). Closing the iterator early disconnects the app's request."""
    messages: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    disconnected = asyncio.Event()
    body_sent = False

    async def receive() -> dict[str, Any]:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await messages.put(message)

    task = asyncio.create_task(app(http_scope(request), receive, send))
    task.add_done_callback(lambda _: messages.put_nowait(None))
    try:
        async for part in _parts(messages, task, extra_headers):
            yield part
    finally:
        disconnected.set()
        await _finish(task)


async def _parts(messages: asyncio.Queue[dict[str, Any] | None], task: asyncio.Task[None],
                 extra_headers: tuple[tuple[bytes, bytes], ...]) -> AsyncIterator[ResponseStart | bytes]:
    started = False
    while (message := await messages.get()) is not None:
        if message["type"] == "http.response.start":
            started = True
            headers = tuple((bytes(k), bytes(v)) for k, v in message.get("headers", ()))
            yield ResponseStart(message["status"], headers + extra_headers)
        elif message["type"] == "http.response.body":
            if message.get("body"):
                yield bytes(message["body"])
            if not message.get("more_body", False):
                return
    if not started:
        error = task.exception() if task.done() and not task.cancelled() else None
        raise RuntimeError("the app ended without a response") from error


async def _finish(task: asyncio.Task[None]) -> None:
    """Let the app's task end after the disconnect (it aborts its engine request), cancel it if it
    does not within the grace period."""
    if task.done():
        return
    try:
        await asyncio.wait_for(asyncio.shield(task), _DISCONNECT_GRACE_S)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        task.cancel()
    except Exception:   # the app's own failure after its response ended: logged, nothing to answer
        logger.exception("forwarded request failed after its response")

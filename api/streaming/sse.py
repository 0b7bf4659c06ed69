"""Server-sent events: `data: <json>` chunks ending with `data: [DONE]` (chat and completions),
`event: <type>` + `data: <json>` events (Responses), an in-stream error as one final event, and
cleanup on every exit path."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from pydantic import BaseModel
from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from api.http.errors import error_body

logger = logging.getLogger(__name__)

DONE = "[DONE]"


async def sse_data(chunks: AsyncIterator[BaseModel], request_id: str) -> AsyncGenerator[str, None]:
    """JSON of each chunk, then "[DONE]". An exception from `chunks` becomes one error event and
    ends the stream without [DONE] (the OpenAI SDK raises APIError on it)."""
    try:
        async with contextlib.aclosing(chunks):  # type: ignore[type-var]
            async for chunk in chunks:
                yield chunk.model_dump_json()
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error can only be an event
        logger.warning("request %s: stream failed: %s", request_id, exc)
        yield error_body(exc).model_dump_json()
        return
    yield DONE


async def sse_typed_events(
    events: AsyncIterator[BaseModel], request_id: str
) -> AsyncGenerator[dict[str, str], None]:
    """One SSE event per model, named by its `type` field (`event: response.created`), no [DONE].

    The producer is expected to report its own failures as events (Responses: `error` then
    `response.failed`); an exception that still escapes becomes one `error` event numbered after
    the last event sent.
    """
    next_number = 0
    try:
        async with contextlib.aclosing(events):  # type: ignore[type-var]
            async for event in events:
                next_number = getattr(event, "sequence_number", next_number) + 1
                yield {"event": str(getattr(event, "type", "message")), "data": event.model_dump_json()}
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error can only be an event
        logger.warning("request %s: stream failed: %s", request_id, exc)
        info = error_body(exc).error
        data = {
            "type": "error",
            "code": info.code,
            "message": info.message,
            "param": info.param,
            "sequence_number": next_number,
        }
        yield {"event": "error", "data": json.dumps(data)}


class EngineEventSourceResponse(EventSourceResponse):
    """An EventSourceResponse (events separated by a blank line, `\\n` line ends) that closes its
    event generator and runs `on_close` however it ends: completion, client disconnect (sse-starlette
    cancels the sender), or server shutdown. `on_close` aborts unfinished engine requests."""

    def __init__(
        self,
        events: AsyncGenerator[Any, None],
        on_close: Callable[[], Awaitable[None]],
        ping_interval_s: float,
    ) -> None:
        super().__init__(events, sep="\n", ping=ping_interval_s)
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the events; always close the generator and run `on_close` afterwards."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await self._events.aclose()
                finally:
                    await self._on_close()

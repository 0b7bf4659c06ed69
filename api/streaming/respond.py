"""Running an API request's engine streams to an HTTP response, streamed (SSE) or whole (JSON),
with the engine requests aborted whenever the client leaves first."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import Request
from pydantic import BaseModel
from starlette.responses import Response

from api.http.context import ServerContext
from api.streaming.disconnects import cancel_on_disconnect
from api.streaming.engine_stream import EngineStream, StreamGroup
from api.streaming.sse import EngineEventSourceResponse, sse_data
from api.observability.stream_tracker import track
from engine import EngineRequest, RequestOutput

Outputs = AsyncIterator[tuple[int, RequestOutput]]
SseEncoder = Callable[[AsyncIterator[BaseModel], str], AsyncGenerator[Any, None]]


async def respond(
    request: Request,
    context: ServerContext,
    engine_requests: list[EngineRequest],
    stream: bool,
    chunks: Callable[[Outputs], AsyncIterator[BaseModel]],
    whole: Callable[[Outputs], Awaitable[BaseModel]],
    sse: SseEncoder = sse_data,
    grammar_param: str | None = None,
    reads_calls: bool = False,
) -> Response:
    """Submit `engine_requests` and answer: SSE of `chunks(outputs)` when `stream`, else the JSON of
    `whole(outputs)`. `sse` frames the streamed objects (default: `data:` chunks and [DONE]).
    `grammar_param` names the request field of the requests' grammar in a compile failure.
    `reads_calls`: a ToolCallCounter counts the requests' decided finish reasons (`track`).

    Every request is checked by the engine before any is queued, and the first output is awaited
    before any byte is sent, so engine errors raised before it are ordinary HTTP errors. A client that disconnects (before the first output, during a whole
    answer, or mid-stream) gets its engine requests aborted at once. Each engine request's outputs
    feed the app's latency metrics and the request's log record (`api/observability/stream_tracker.py`).
    """
    request_id = getattr(request.state, "request_id", "-")
    group = StreamGroup([])
    try:
        # Each request is checked by the engine as its stream is built: all before any is queued.
        for r in engine_requests:
            tracker = track(request, r, reads_calls=reads_calls)
            group.streams.append(EngineStream(context.engine, r, tracker, grammar_param))
        await cancel_on_disconnect(request.receive, group.start(), request_id)
    except BaseException:
        await _close(group)
        raise
    if stream:
        events = sse(chunks(group.outputs()), request_id)
        return EngineEventSourceResponse(events, group.aclose, context.config.sse_ping_interval_s)
    try:
        result = await cancel_on_disconnect(request.receive, whole(group.outputs()), request_id)
    finally:
        await _close(group)
    return Response(result.model_dump_json(), media_type="application/json")


async def _close(group: StreamGroup) -> None:
    with anyio.CancelScope(shield=True):
        await group.aclose()

"""Engine outputs of one /v1/responses request -> the response object (whole) or its events (stream).

Stream: response.created, response.in_progress, the items' events (`api/responses/output.py`),
then exactly one of response.completed / response.incomplete / response.failed. A failure after
the stream started is an `error` event followed by response.failed. The finished response is
stored (when `store` is true) before its terminal event or JSON is sent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from api.http.errors import error_body
from api.responses.protocol.events import ErrorEvent, ResponseLifecycleEvent, StreamEvent
from api.responses.protocol.objects import ResponseObject
from api.responses.output import EventCounter, ResponseOutputBuilder
from api.responses.run import ResponseRun
from engine import RequestOutput

logger = logging.getLogger(__name__)

Outputs = AsyncIterator[tuple[int, RequestOutput]]
TerminalEvent = Literal["response.completed", "response.incomplete", "response.failed"]
_TERMINAL_EVENTS: dict[str, TerminalEvent] = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
}


@dataclass(slots=True)
class _Progress:
    finish_reason: str | None = None
    last: RequestOutput | None = None


async def _item_events(
    outputs: Outputs, builder: ResponseOutputBuilder, progress: _Progress
) -> AsyncIterator[StreamEvent]:
    """Feed every engine delta to `builder`, yielding its events; then close the output."""
    async with contextlib.aclosing(outputs):  # type: ignore[type-var]
        async for _, out in outputs:
            for delta in out.deltas:
                for event in builder.feed(delta.text, delta.finish_reason, delta.logprobs):
                    yield event
            progress.last = out
    progress.finish_reason = builder.finish_reason
    for event in builder.finish(incomplete=progress.finish_reason == "length"):
        yield event


async def whole_response(outputs: Outputs, run: ResponseRun) -> ResponseObject:
    """Gather the outputs into the finished response object (stored when `store` is true)."""
    builder = ResponseOutputBuilder(run.tool_calling, EventCounter(), run.on_tool_calls, run.logprobs)
    progress = _Progress()
    async for _ in _item_events(outputs, builder, progress):
        pass
    response = run.finished(builder.items, progress.finish_reason, progress.last)
    await run.save(response)
    return response


async def response_events(outputs: Outputs, run: ResponseRun) -> AsyncIterator[StreamEvent]:
    """The events of a streamed response, numbered 0, 1, 2, ... (see the module docstring)."""
    counter = EventCounter()
    builder = ResponseOutputBuilder(run.tool_calling, counter, run.on_tool_calls, run.logprobs)
    progress = _Progress()
    started = run.snapshot("in_progress")
    yield ResponseLifecycleEvent(type="response.created", sequence_number=counter.next(), response=started)
    yield ResponseLifecycleEvent(
        type="response.in_progress", sequence_number=counter.next(), response=started
    )
    try:
        async for event in _item_events(outputs, builder, progress):
            yield event
    except Exception as exc:  # noqa: BLE001 - the stream has started: the failure can only be events
        logger.warning("response %s: stream failed: %s", run.initial.id, exc)
        for event in builder.abandon():
            yield event
        failed = run.failed(exc, builder.items, progress.last)
        await run.save(failed)
        info = error_body(exc).error
        yield ErrorEvent(
            sequence_number=counter.next(), code=info.code, message=info.message, param=info.param
        )
        yield ResponseLifecycleEvent(type="response.failed", sequence_number=counter.next(), response=failed)
        return
    response = run.finished(builder.items, progress.finish_reason, progress.last)
    await run.save(response)
    yield ResponseLifecycleEvent(
        type=_TERMINAL_EVENTS[response.status],
        sequence_number=counter.next(),
        response=response,
    )

"""Iterating engine requests so that they always end: a stream that is not read to the end is
closed, which aborts its request in the engine and frees its KV blocks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from api.http.context import EngineClient
from api.errors import RequestAborted, RequestGrammarError
from api.observability.stream_tracker import StreamTracker
from constrained.errors import GrammarError
from engine import EngineRequest, RequestOutput

logger = logging.getLogger(__name__)


class EngineStream:
    """The outputs of one EngineRequest. Building it hands the request to `engine.generate`, which
    checks it against the model at once (raises here: context length, token ids, overload; the
    tracker notes the failure and is closed); `start()` waits for the first output so that errors
    the engine raises before it become a plain HTTP error too; `aclose()` closes the engine
    generator and aborts the request unless it finished.

    An output whose choice finished with "abort", or an engine generator that ends early, raises
    RequestAborted: the engine gave up on the request (e.g. shutdown).

    `tracker`, when given, sees every output as it arrives, every failure, and the close.
    `grammar_param`: the request field the request's grammar came from; a compile failure of that
    grammar is raised as RequestGrammarError naming it.
    """

    def __init__(self, engine: EngineClient, request: EngineRequest, tracker: StreamTracker | None = None,
                 grammar_param: str | None = None) -> None:
        self.engine = engine
        self.grammar_param = grammar_param
        self.request_id = request.request_id
        self.finished = False
        self.tracker = tracker
        self._first: RequestOutput | None = None
        try:
            self._outputs = engine.generate(request)
        except Exception as exc:  # noted for the log line, then raised to the caller
            if tracker is not None:
                tracker.failed(exc)
                tracker.closed(False)
            raise

    async def start(self) -> None:
        """Wait for the first output (raises what the engine raises before it)."""
        self._first = await self._next()

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        if self._first is not None:
            out, self._first = self._first, None
        else:
            out = await self._next()
        self.finished = out.finished
        return out

    async def aclose(self) -> None:
        """Stop the request: close the engine generator, abort it in the engine if unfinished."""
        try:
            if self.finished and self._first is None:
                # let the generator run past its last yield and return: closing it there instead
                # would look like an abandoned request to the engine
                with contextlib.suppress(StopAsyncIteration):
                    await self._outputs.__anext__()
            await self._outputs.aclose()  # type: ignore[attr-defined]
        except RuntimeError as exc:  # still running in a task being torn down; the abort below suffices
            logger.warning("request %s: could not close the engine stream: %s", self.request_id, exc)
        finally:
            if not self.finished:
                logger.info("request %s: aborted before it finished", self.request_id)
                self.engine.abort(self.request_id)
            if self.tracker is not None:
                self.tracker.closed(self.finished)

    async def _next(self) -> RequestOutput:
        try:
            out = await self._receive()
        except Exception as exc:  # only noted for the log line; the caller handles it
            if self.tracker is not None:
                self.tracker.failed(exc)
            if isinstance(exc, GrammarError) and self.grammar_param is not None:
                raise RequestGrammarError(exc, self.grammar_param) from exc
            raise
        if self.tracker is not None:
            self.tracker.on_output(out)
        return out

    async def _receive(self) -> RequestOutput:
        try:
            out = await self._outputs.__anext__()
        except StopAsyncIteration:
            raise RequestAborted("the engine ended the request before it finished") from None
        if out.error is not None:
            raise out.error
        if any(d.finish_reason == "abort" for d in out.deltas):
            raise RequestAborted("the server aborted the request")
        return out


class StreamGroup:
    """The EngineStreams of one API request (several for a batch of completions prompts)."""

    def __init__(self, streams: list[EngineStream]) -> None:
        self.streams = streams

    async def start(self) -> None:
        """Start every stream; the first failure cancels the others' starts and is raised."""
        if len(self.streams) == 1:
            await self.streams[0].start()
            return
        tasks = [asyncio.ensure_future(s.start()) for s in self.streams]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(stream index, output) in arrival order until every stream has finished."""
        if len(self.streams) == 1:
            async for out in self.streams[0]:
                yield 0, out
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()
        tasks = [asyncio.ensure_future(_pump(i, s, queue)) for i, s in enumerate(self.streams)]
        try:
            remaining = len(tasks)
            while remaining:
                idx, item = await queue.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield idx, item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """Close every stream (aborting the unfinished ones)."""
        for stream in self.streams:
            await stream.aclose()


async def _pump(
    idx: int, stream: EngineStream, queue: asyncio.Queue[tuple[int, RequestOutput | Exception | None]]
) -> None:
    try:
        async for out in stream:
            queue.put_nowait((idx, out))
        queue.put_nowait((idx, None))
    except Exception as exc:  # noqa: BLE001 - handed to the consumer, which raises it
        queue.put_nowait((idx, exc))

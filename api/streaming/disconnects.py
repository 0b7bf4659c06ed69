"""Cancelling work whose HTTP client has gone away (non-streamed answers and stream start-up)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from api.errors import ClientDisconnected

logger = logging.getLogger(__name__)

T = TypeVar("T")


async def cancel_on_disconnect(receive: Receive, work: Awaitable[T], request_id: str) -> T:
    """Await `work` while watching `receive` for `http.disconnect`.

    The request body must have been read already. On disconnect `work` is cancelled (which stops
    the engine generators it awaits, aborting their requests) and ClientDisconnected is raised.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this coroutine itself is cancelled: the work must not outlive it
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        logger.info("request %s: client disconnected; request cancelled", request_id)
        raise ClientDisconnected("the client disconnected")
    return task.result()


async def _until_disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return

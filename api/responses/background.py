"""`background: true` responses: run in asyncio tasks owned by the app, polled through the store.

Statuses as stored: queued (accepted) -> in_progress (the engine produced its first output) ->
completed / incomplete / failed, or cancelled (POST .../cancel, or server shutdown). Cancelling
the task closes its engine stream, which aborts the request in the engine and frees its blocks.

While any task runs, a watcher renews their leases in the store every `poll_s` seconds and
cancels the tasks whose rows ask it to stop: a cancel or delete sent to another server sharing
the store reaches the owner that way (`ResponsesStore.renew_leases`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import anyio

from api.streaming.engine_stream import EngineStream, StreamGroup
from api.responses.run import ResponseRun
from api.responses.stream import whole_response
from api.responses.store import ResponsesStore

logger = logging.getLogger(__name__)


class BackgroundResponses:
    """The running background responses of one app, by response id, and their lease watcher.

    `poll_s`: seconds between lease renewals (None: a quarter of the store's lease, at most 0.25 s),
    which bounds how late a cancel sent to another server takes effect here.
    """

    def __init__(self, store: ResponsesStore, poll_s: float | None = None) -> None:
        self._store = store
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.poll_s = poll_s if poll_s is not None else min(0.25, store.settings.lease_s / 4)
        self._watcher: asyncio.Task[None] | None = None

    def start(self, response_id: str, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in a task registered under `response_id` until it ends."""
        task = asyncio.create_task(work, name=f"response {response_id}")
        self._tasks[response_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(response_id, None))
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(), name="background response leases")

    async def _watch(self) -> None:
        """Renew the leases of the running tasks and cancel those the store says must stop, until
        no task runs (`start` begins a new watcher then)."""
        stopped: set[asyncio.Task[None]] = set()   # cancelled already, still storing "cancelled"
        try:
            while self._tasks:
                await asyncio.sleep(self.poll_s)
                try:
                    stop = await self._store.renew_leases(list(self._tasks))
                except Exception as exc:  # noqa: BLE001 - a store outage: try again next round
                    logger.warning("renewing background response leases failed: %s", exc)
                    continue
                for response_id in stop:
                    task = self._tasks.get(response_id)
                    if task is not None and task not in stopped:
                        logger.info("response %s: cancelled or deleted through the store", response_id)
                        stopped.add(task)
                        task.cancel()
                stopped = {task for task in stopped if not task.done()}
        finally:
            self._watcher = None

    @property
    def num_running(self) -> int:
        """Background responses whose task has not ended yet."""
        return len(self._tasks)

    def is_running(self, response_id: str) -> bool:
        """Whether a task for `response_id` is still running."""
        return response_id in self._tasks

    async def cancel(self, response_id: str) -> bool:
        """Cancel the task of `response_id` and wait until it has stored its final status.

        False when no task runs for it (finished already, or started by an earlier process).
        """
        task = self._tasks.get(response_id)
        if task is None:
            return False
        task.cancel()
        await asyncio.wait([task])
        return True

    async def shutdown(self) -> None:
        """Cancel every running task and wait for them."""
        tasks = list(self._tasks.values())
        if self._watcher is not None:
            self._watcher.cancel()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


async def run_in_background(stream: EngineStream, run: ResponseRun) -> None:
    """Generate the response of `stream` (built, so checked by the engine, before the response was
    queued), storing each status it reaches (see the module docstring).

    A failure is stored as status "failed" with the client-safe error message. The stream's
    tracker sees the outputs (metrics, and the log line, which it should hold until the
    generation ends); its `grammar_param` names the request field of its grammar in a compile failure.
    """
    group = StreamGroup([stream])
    try:
        await group.start()
        await run.save(run.snapshot("in_progress"))
        await whole_response(group.outputs(), run)
    except asyncio.CancelledError:
        logger.info("response %s: cancelled", run.initial.id)
        with anyio.CancelScope(shield=True):
            await run.save(run.snapshot("cancelled"))
        raise
    except Exception as exc:  # noqa: BLE001 - no client is waiting: the failure is the stored status
        logger.warning("response %s: failed: %s", run.initial.id, exc)
        await run.save(run.failed(exc))
    finally:
        with anyio.CancelScope(shield=True):
            await group.aclose()

"""Graceful shutdown: on SIGTERM (or SIGINT) drain, then let uvicorn close, then exit 0.

The sequence, after the signal:
1. The app drains (`api/http/draining.py`): new requests get 503 `shutting_down`; the listening socket
   stays open meanwhile, so clients get that answer rather than a refused connection.
2. Running requests (HTTP requests, streams and background responses) get `grace_s` seconds to end.
3. Whatever still runs is aborted in the engine: a whole answer becomes a 503 `request_aborted`,
   a stream ends with that error as its last event, a background response is stored as failed.
4. uvicorn's own shutdown closes the connections and runs the app's lifespan shutdown, which
   closes the Responses store after its queued writes.
The process then exits 0, not by the re-raised signal as uvicorn would have it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from types import FrameType

import uvicorn
from fastapi import FastAPI
from sse_starlette.sse import AppStatus

from api.config import ServerConfig
from api.http.context import EngineClient
from api.http.draining import DrainState
from api.responses.background import BackgroundResponses

logger = logging.getLogger(__name__)

ABORT_WAIT_S = 5.0   # seconds aborted requests get to send their error after the grace period
BACKSTOP_S = 5.0     # uvicorn's timeout_graceful_shutdown: connections left after the drain
_POLL_S = 0.05


async def drain(drain_state: DrainState, background: BackgroundResponses, engine: EngineClient,
                grace_s: float, give_up: Callable[[], bool] = lambda: False) -> bool:
    """Refuse new requests, wait up to `grace_s` seconds for the running ones to end, then abort
    the rest in the engine and wait up to ABORT_WAIT_S for them to answer.

    Returns True when everything ended within the grace period. `give_up()` True (a second
    Ctrl-C) stops the waiting at once.
    """
    drain_state.draining = True
    logger.info("draining: %d requests in flight, %d background responses; grace %g s",
                drain_state.num_in_flight, background.num_running, grace_s)
    if await _wait_idle(drain_state, background, grace_s, give_up):
        logger.info("drained: every request finished")
        return True
    logger.warning("grace period over: aborting %d requests and %d background responses",
                   drain_state.num_in_flight, background.num_running)
    engine.abort_all()
    await _wait_idle(drain_state, background, ABORT_WAIT_S, give_up)
    return False


async def _wait_idle(drain_state: DrainState, background: BackgroundResponses, timeout_s: float,
                     give_up: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while drain_state.num_in_flight or background.num_running:
        if give_up() or time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_S)
    return True


class DrainingServer(uvicorn.Server):
    """uvicorn's Server that drains the app (`drain`) before uvicorn's own shutdown and, after
    SIGTERM or SIGINT, returns from `run()` normally so that the process exits 0.

    Turns off sse-starlette's cancel-every-stream-at-SIGTERM (process-wide): streams run on
    until they finish or the drain aborts them.
    """

    def __init__(self, config: uvicorn.Config, app: FastAPI, engine: EngineClient, grace_s: float) -> None:
        super().__init__(config)
        self.drain_state: DrainState = app.state.drain
        self.background: BackgroundResponses = app.state.responses.background
        self.engine = engine
        self.grace_s = grace_s
        AppStatus.disable_automatic_graceful_drain()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler: start the shutdown (a second SIGINT forces it), as uvicorn does."""
        super().handle_exit(sig, frame)
        # uvicorn (>= 0.29) re-raises the captured signal once serving ends, which would end the
        # process by that signal (status 143 / 130) after a clean drain; keep the exit normal.
        self._captured_signals.clear()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Drain, let sse-starlette close what is left, then uvicorn's shutdown (lifespan included)."""
        await drain(self.drain_state, self.background, self.engine, self.grace_s, lambda: self.force_exit)
        AppStatus.should_exit = True
        await super().shutdown(sockets)


def run_server(app: FastAPI, engine: EngineClient, config: ServerConfig) -> None:
    """Serve `app` on config.host:config.port until SIGTERM / SIGINT, then shut down gracefully
    (module docstring); idle connections stay open for `config.keep_alive_s`.

    Blocks. Exits the process with status 1 or 3 when uvicorn cannot start (port in use, lifespan
    failure), as uvicorn.run does.
    """
    uvicorn_config = uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                    timeout_keep_alive=config.keep_alive_s,
                                    timeout_graceful_shutdown=int(BACKSTOP_S))
    DrainingServer(uvicorn_config, app, engine, config.shutdown_grace_s).run()

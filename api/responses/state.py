"""What the /v1/responses routes share across requests: the store and the background tasks."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from api.responses.background import BackgroundResponses
from api.responses.store import ResponsesStore

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class ResponsesState:
    """The app's response store and its running background responses (`app.state.responses`)."""

    store: ResponsesStore
    background: BackgroundResponses = field(init=False)

    def __post_init__(self) -> None:
        self.background = BackgroundResponses(self.store)

    async def maintain(self) -> None:
        """Until cancelled, every `lease_s` seconds of the store's settings: fail the unfinished
        responses whose servers are gone (`fail_expired_leases`) and remove the responses past the
        retention period (`remove_expired`). The app's lifespan runs it; the first round runs at
        start-up, before a restarted server's earlier background responses are asked about."""
        while True:
            try:
                await self.store.fail_expired_leases()
                await self.store.remove_expired()
            except Exception as exc:  # noqa: BLE001 - a store outage must not end the loop
                logger.warning("responses store upkeep failed: %s", exc)
            await asyncio.sleep(self.store.settings.lease_s)

    async def close(self) -> None:
        """Cancel the background responses (they store "cancelled"), then close the store."""
        await self.background.shutdown()
        self.store.close()


def get_responses_state(request: Request) -> ResponsesState:
    """FastAPI dependency: the app's ResponsesState."""
    state: ResponsesState = request.app.state.responses
    return state


Responses = Annotated[ResponsesState, Depends(get_responses_state)]
"""Route parameter type that receives the app's ResponsesState."""

"""What the /v1/responses routes share across requests: the store and the background tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from api.responses.background import BackgroundResponses
from api.responses.store import ResponsesStore


@dataclass(slots=True)
class ResponsesState:
    """The app's response store and its running background responses (`app.state.responses`)."""

    store: ResponsesStore
    background: BackgroundResponses = field(default_factory=BackgroundResponses)

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

"""POST /v1/responses/{id}/cancel wherever the background response runs.

Run here: its task is cancelled and has stored "cancelled" when this returns. Run by another
server sharing the store: the row gets a cancel request, which the owner reads within its lease
poll (`api/responses/background.py`) and answers by cancelling its task; this server waits for
the stored status to turn terminal. When the owner's lease has expired (its server is gone) the
response is stored "cancelled" here. If the owner is alive but has not stored a final status
within `wait_s`, the answer is the stored response as it then is (still in progress): the cancel
request stays in the row and takes effect when the owner next reads it.
"""

from __future__ import annotations

import asyncio
import time

from api.responses.state import ResponsesState
from api.responses.store import StoredResponse

_POLL_S = 0.05


async def cancel_background(
    state: ResponsesState, stored: StoredResponse, wait_s: float
) -> StoredResponse | None:
    """Cancel the background response `stored` (see the module docstring) and return its row
    afterwards (None when it was deleted meanwhile). A finished response is returned unchanged."""
    if stored.is_finished:
        return stored
    if await state.background.cancel(stored.id):
        return await state.store.get(stored.id)
    row = await state.store.request_cancel(stored.id)
    deadline = time.monotonic() + wait_s
    while row is not None and not row.is_finished and time.monotonic() < deadline:
        await asyncio.sleep(_POLL_S)
        row = await state.store.get(stored.id)
    if row is not None and not row.is_finished:
        row = await state.store.request_cancel(stored.id)  # its lease may have run out meanwhile
    return row

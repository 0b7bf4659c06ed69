"""One stored response as the store hands it out, and the statuses the store reasons about."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

UNFINISHED_STATUSES = ("queued", "in_progress")
"""Statuses of a background response that is still running (or that nobody finished)."""
TERMINAL_STATUSES = ("completed", "incomplete", "failed", "cancelled")
"""Final statuses: a stored response that reached one is never written again."""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """One row: the response object as JSON text and its input items as a JSON array text.

    `owner` is the server id (`ServerIdentity.server_id`) that created the response (and runs or
    ran it); `cancel_requested` is True once some server was asked to cancel it (background only).
    Both are set by the store, never by a writer: `put` ignores them.
    """

    id: str
    status: str
    background: bool
    previous_response_id: str | None
    response_json: str
    input_items_json: str
    owner: str | None = None
    cancel_requested: bool = False

    def input_items(self) -> list[dict[str, Any]]:
        """The input items, parsed."""
        items: list[dict[str, Any]] = json.loads(self.input_items_json)
        return items

    def output_items(self) -> list[dict[str, Any]]:
        """The response's output items, parsed."""
        output: list[dict[str, Any]] = json.loads(self.response_json).get("output", [])
        return output

    @property
    def is_finished(self) -> bool:
        """Whether the status is terminal (completed, incomplete, failed, cancelled)."""
        return self.status in TERMINAL_STATUSES

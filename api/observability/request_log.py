"""One structured log line per generation request (chat, completions, responses) at its completion.

The line is `request done key=value ...` on the `api.observability.request_log` logger at INFO; the same fields
ride on the LogRecord as `record.request_log` (a dict) for JSON handlers. Fields:

| key | meaning |
| --- | --- |
| request_id | the `x-request-id` of the HTTP request |
| endpoint | the path, e.g. /v1/chat/completions |
| model, adapter | the served model name (the adapter's name for a LoRA request); the LoRA adapter or - |
| status | HTTP status sent (- when none was: the client left or the server stopped first) |
| outcome | ok, error (a 4xx/5xx, or a failure after a stream began) or aborted (client left, cancelled) |
| prompt_tokens, output_tokens | totals over the request's engine requests and choices |
| ttft_s, total_s | seconds from the HTTP request to its first token / to the end of the response |
| finish_reason | each choice's finish_reason as its client got it, comma-separated (- when none) |
| tool_calls | tool calls parsed from the output |
| error | exception class of a failure, or - |

A `background: true` response is logged when its generation ends, not when the HTTP answer is sent.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

LOGGED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})
_CLIENT_CLOSED = 499


@dataclass(slots=True)
class RequestRecord:
    """What the completion line of one HTTP request reports; filled while it runs (event loop only).

    Times are `time.monotonic()` seconds. The line is written once every holder has released the
    record: the HTTP exchange (`finish_http`) and, for a background response, its generation.
    """

    request_id: str
    endpoint: str
    started_at: float
    model: str | None = None
    adapter: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    first_token_at: float | None = None
    finish_reasons: list[str] = field(default_factory=list)
    num_tool_calls: int = 0
    error: str | None = None
    aborted: bool = False
    status: int | None = None
    finished_at: float | None = None
    _holds: int = 1

    def hold(self) -> None:
        """Delay the log line until a matching `release` (work that outlives the HTTP answer)."""
        self._holds += 1

    def release(self) -> None:
        """Drop one hold; the last one writes the log line."""
        self._holds -= 1
        if self._holds == 0:
            self.finished_at = time.monotonic()
            fields = self.fields()
            logger.info("request done %s", format_fields(fields), extra={"request_log": fields})

    def finish_http(self, status: int | None) -> None:
        """The HTTP exchange ended having sent `status` (None: no response was started)."""
        self.status = status
        self.release()

    @property
    def outcome(self) -> str:
        """"ok", "error" or "aborted" (see the module docstring)."""
        if self.error is not None or (self.status is not None and self.status >= 400 and
                                      self.status != _CLIENT_CLOSED):
            return "error"
        if self.aborted or self.status is None or self.status == _CLIENT_CLOSED:
            return "aborted"
        return "ok"

    def fields(self) -> dict[str, Any]:
        """The log fields in line order (seconds rounded to 0.1 ms; None where unknown)."""
        end = self.finished_at if self.finished_at is not None else time.monotonic()
        ttft = None if self.first_token_at is None else round(self.first_token_at - self.started_at, 4)
        return {
            "request_id": self.request_id,
            "endpoint": self.endpoint,
            "model": self.model,
            "adapter": self.adapter,
            "status": self.status,
            "outcome": self.outcome,
            "prompt_tokens": self.num_prompt_tokens,
            "output_tokens": self.num_output_tokens,
            "ttft_s": ttft,
            "total_s": round(end - self.started_at, 4),
            "finish_reason": ",".join(self.finish_reasons) or None,
            "tool_calls": self.num_tool_calls,
            "error": self.error,
        }


def format_fields(fields: dict[str, Any]) -> str:
    """`key=value` pairs separated by spaces; None as "-", values with spaces, quotes or "=" JSON-quoted."""
    parts = []
    for key, value in fields.items():
        text = "-" if value is None else str(value)
        if not text or any(c.isspace() or c in '"=' for c in text):
            text = json.dumps(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


def request_record(request: Request) -> RequestRecord | None:
    """The record of `request` (set by RequestLogMiddleware for LOGGED_PATHS; None elsewhere)."""
    record: RequestRecord | None = getattr(request.state, "request_record", None)
    return record


class RequestLogMiddleware:
    """Pure ASGI: gives each POST to LOGGED_PATHS a RequestRecord (`request.state.request_record`)
    and releases it when the response has been sent, the stream included. Must run inside
    RequestIdMiddleware, whose `request_id` it reads."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in LOGGED_PATHS:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        record = RequestRecord(str(state.get("request_id", "-")), scope["path"], time.monotonic())
        state["request_record"] = record
        status: int | None = None

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception as exc:  # only noted: RequestIdMiddleware renders it as a 500
            record.error = record.error or type(exc).__name__
            raise
        finally:
            record.finish_http(status)

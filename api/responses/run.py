"""One /v1/responses request while it runs: the response object at each status, and storing it.

The object echoes the request's settings (tools, tool_choice, text, temperature, ...) from the
start; only status, output, usage, error and incomplete_details change. When the request has
`store` true (the default) every status it reaches is written to the store before a client can
see it, so `previous_response_id` works as soon as a response is reported finished.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from api.http.errors import error_body
from api.responses.protocol.objects import (
    IncompleteDetails,
    OutputItem,
    ResponseError,
    ResponseObject,
    ResponseStatus,
    ResponseUsage,
    StoredInputItem,
)
from api.responses.protocol.request import ResponsesRequest
from api.responses.store import TERMINAL_STATUSES, ResponsesStore, StoredResponse
from api.generation.reader import ToolCallObserver
from api.generation.constraints import ToolCalling
from api.protocol.logprobs_output import LogprobFormatter
from engine import RequestOutput

def initial_response(body: ResponsesRequest, response_id: str, model: str) -> ResponseObject:
    """The response object of `body` before any output (status "in_progress")."""
    choice = body.tool_choice
    text_format = body.text.format if body.text is not None else None
    return ResponseObject(
        id=response_id,
        created_at=int(time.time()),
        status="in_progress",
        background=bool(body.background),
        instructions=body.instructions,
        max_output_tokens=body.max_output_tokens,
        model=model,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        previous_response_id=body.previous_response_id,
        store=body.store is not False,
        temperature=1.0 if body.temperature is None else body.temperature,
        text={"format": text_format.model_dump(by_alias=True) if text_format else {"type": "text"}},
        tool_choice=choice.model_dump()
        if choice is not None and not isinstance(choice, str)
        else choice or "auto",
        tools=[tool.model_dump() for tool in body.tools or []],
        top_p=1.0 if body.top_p is None else body.top_p,
        top_logprobs=body.top_logprobs or 0,
        user=body.user,
        metadata=body.metadata or {},
    )


def items_json(items: Sequence[StoredInputItem]) -> str:
    """The JSON array of `items` (written once per request, stored with every status)."""
    return "[" + ",".join(item.model_dump_json() for item in items) + "]"


def usage_of(out: RequestOutput | None) -> ResponseUsage | None:
    """Usage from the last engine output's running totals (None before any output)."""
    if out is None:
        return None
    return ResponseUsage.of(out.num_prompt_tokens, out.num_output_tokens, out.num_cached_tokens)


@dataclass(frozen=True, slots=True)
class ResponseRun:
    """A response being produced: its initial object, its normalized input items as one JSON
    array (what input_items lists), how its output is parsed, and the store (None: `store` false).
    `on_tool_calls` sees the parsed tool calls (metrics); `logprobs` formats output_text logprobs
    (None: not requested)."""

    initial: ResponseObject
    input_items_json: str
    tool_calling: ToolCalling | None
    store: ResponsesStore | None
    on_tool_calls: ToolCallObserver | None = None
    logprobs: LogprobFormatter | None = None

    def snapshot(
        self,
        status: ResponseStatus,
        output: Sequence[OutputItem] = (),
        usage: ResponseUsage | None = None,
    ) -> ResponseObject:
        """The response object at `status` with `output` and `usage`."""
        update: dict[str, object] = {"status": status, "output": list(output), "usage": usage}
        if status in TERMINAL_STATUSES:
            update["completed_at"] = int(time.time())
        if status == "incomplete":
            update["incomplete_details"] = IncompleteDetails()
        return self.initial.model_copy(update=update)

    def finished(
        self, output: Sequence[OutputItem], finish_reason: str | None, last: RequestOutput | None
    ) -> ResponseObject:
        """The finished response: "incomplete" (reason max_output_tokens) when the output's
        finish_reason (the reader's decision, `api/generation/ending.py`) is "length", else
        "completed"."""
        status: ResponseStatus = "incomplete" if finish_reason == "length" else "completed"
        return self.snapshot(status, output, usage_of(last))

    def failed(
        self, exc: BaseException, output: Sequence[OutputItem] = (), last: RequestOutput | None = None
    ) -> ResponseObject:
        """The response after a failure: status "failed" and `error` with the client-safe message."""
        message = error_body(exc).error.message
        failed = self.snapshot("failed", output, usage_of(last))
        return failed.model_copy(update={"error": ResponseError(message=message)})

    async def save(self, response: ResponseObject) -> bool:
        """Write `response` (with the input items) to the store, unless the request has `store`
        false. False when the store refused it (the response was deleted or already finished)."""
        if self.store is None:
            return False
        return await self.store.put(
            StoredResponse(
                id=response.id,
                status=response.status,
                background=response.background,
                previous_response_id=response.previous_response_id,
                response_json=response.model_dump_json(),
                input_items_json=self.input_items_json,
            )
        )

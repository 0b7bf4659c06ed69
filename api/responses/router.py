"""POST /v1/responses; GET and DELETE /v1/responses/{id}; POST /v1/responses/{id}/cancel;
GET /v1/responses/{id}/input_items.

A response is translated into GenerationInputs (`api/responses/translate.py`) and prepared by the
same generation core as a chat completion (`api/generation/prepare.py`).
"""

from __future__ import annotations

import uuid
from functools import partial
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

from api.http.auth import require_api_key
from api.generation.prepare import prepare
from api.http.context import Context
from api.errors import InvalidRequest, NotSupported, PreviousResponseNotFound, ResponseNotFound
from api.responses.protocol.objects import InputItemList, ResponseDeleted
from api.responses.protocol.request import ResponsesRequest
from api.http.body import read_body
from api.responses.background import run_in_background
from api.responses.cancel import cancel_background
from api.responses.translate import translate
from api.responses.run import ResponseRun, initial_response, items_json
from api.responses.state import Responses
from api.responses.store import StoredResponse
from api.responses.stream import response_events, whole_response
from api.streaming.engine_stream import EngineStream
from api.streaming.respond import respond
from api.streaming.sse import sse_typed_events
from api.observability.stream_tracker import track
from api.observability.tool_call_metrics import tool_call_counter
from api.protocol.logprobs_output import LogprobFormatter

router = APIRouter(dependencies=[Depends(require_api_key)])

_JSON = "application/json"


@router.post("/v1/responses")
async def create_response(request: Request, context: Context, responses: Responses) -> Response:
    """Generate a response: whole (JSON), streamed (SSE events) or in the background (queued)."""
    body = await read_body(request, ResponsesRequest)
    _check_modes(body)
    model = context.resolve_model(body.model)
    history = []
    if body.previous_response_id is not None:
        found = await responses.store.history(body.previous_response_id)
        if found is None:
            raise PreviousResponseNotFound(
                f"Previous response with id '{body.previous_response_id}' not found.",
                param="previous_response_id",
            )
        history = found
    engine = context.engine
    response_id = f"{context.config.response_id_prefix}{uuid.uuid4().hex}"
    translated, generation = await prepare(engine.tokenizer, context.config, response_id,
                                           partial(translate, body, history, model.lora_name),
                                           lambda translated: translated.inputs)
    grammar_param = generation.constraints.grammar_param
    run = ResponseRun(
        initial=initial_response(body, response_id, model.name),
        input_items_json=items_json(translated.input_items),
        tool_calling=generation.constraints.tool_calling,
        store=responses.store if body.store is not False else None,
        on_tool_calls=tool_call_counter(request, generation.constraints.tool_calling,
                                        generation.engine_request.arrival_time),
        logprobs=LogprobFormatter(engine.tokenizer) if body.logprobs() is not None else None,
    )
    if body.background:
        # Built now, so the engine refuses it now (400 / 429 / 500): a queued answer could not be taken back.
        tracker = track(request, generation.engine_request, hold_record=True,
                        reads_calls=run.on_tool_calls is not None)
        stream = EngineStream(context.engine, generation.engine_request, tracker, grammar_param)
        queued = run.snapshot("queued")
        await run.save(queued)
        responses.background.start(response_id, run_in_background(stream, run))
        return Response(queued.model_dump_json(), media_type=_JSON)
    return await respond(
        request,
        context,
        [generation.engine_request],
        bool(body.stream),
        chunks=partial(response_events, run=run),
        whole=partial(whole_response, run=run),
        sse=sse_typed_events,
        grammar_param=grammar_param,
        reads_calls=run.on_tool_calls is not None,
    )


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, responses: Responses) -> Response:
    """The stored response object (404 when it was not stored or was deleted)."""
    stored = await _stored(responses, response_id)
    return Response(stored.response_json, media_type=_JSON)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, responses: Responses) -> ResponseDeleted:
    """Delete a stored response for good (a background one running here is cancelled first; one
    running on another server sharing the store is stopped by its owner at its next lease poll)."""
    await responses.background.cancel(response_id)
    if not await responses.store.delete(response_id):
        raise _not_found(response_id)
    return ResponseDeleted(id=response_id)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, responses: Responses) -> Response:
    """Cancel a background response, wherever it runs (`api/responses/cancel.py`); a finished one
    is returned unchanged."""
    stored = await _stored(responses, response_id)
    if not stored.background:
        raise InvalidRequest(
            "Only responses created with background: true can be cancelled.", param="response_id"
        )
    cancelled = await cancel_background(responses, stored, wait_s=responses.store.settings.lease_s)
    if cancelled is None:
        raise _not_found(response_id)
    return Response(cancelled.response_json, media_type=_JSON)


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    responses: Responses,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    include: Annotated[list[str] | None, Query()] = None,
) -> InputItemList:
    """A page of the response's input items: `limit` items after the item `after`, in `order`
    (`include` is accepted and ignored: the items have nothing to add)."""
    stored = await _stored(responses, response_id)
    items = stored.input_items()
    if order == "desc":
        items.reverse()
    start = 0
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise InvalidRequest(
                f"No input item with id '{after}' in response '{response_id}'.", param="after"
            )
        start = ids.index(after) + 1
    page = items[start : start + limit]
    return InputItemList(
        data=page,
        first_id=page[0]["id"] if page else None,
        last_id=page[-1]["id"] if page else None,
        has_more=start + limit < len(items),
    )


def _check_modes(body: ResponsesRequest) -> None:
    if body.background and body.stream:
        raise NotSupported(
            "background responses cannot be streamed here; poll GET /v1/responses/{id}", param="stream"
        )
    if body.background and body.store is False:
        raise InvalidRequest("background responses must be stored: send store true", param="store")


async def _stored(responses: Responses, response_id: str) -> StoredResponse:
    stored = await responses.store.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


def _not_found(response_id: str) -> ResponseNotFound:
    return ResponseNotFound(f"Response with id '{response_id}' not found.", param="response_id")

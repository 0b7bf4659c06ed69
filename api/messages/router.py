"""POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) on chat's
generation path: translate the body, prepare the generation, answer (JSON or typed SSE events).

The `anthropic-version` header is accepted and not checked (one version of the shapes is
served); the API key may come as `x-api-key` or as a bearer token (`api/http/auth.py`).
Errors on these routes use Anthropic's body (`api/http/errors.py`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from functools import partial

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api.http.context import Context
from api.generation.constraints import request_constraints
from api.generation.prepare import prepare
from api.generation.render import render_prompt_sync
from api.http.auth import require_api_key
from api.http.body import read_body
from api.messages.objects import CountTokensResult
from api.messages.output import MessageBuilder, MessageOptions, message_events, whole_message
from api.messages.protocol import CountTokensRequest, MessagesRequest
from api.messages.translate import translate
from api.observability.tool_call_metrics import tool_call_counter
from api.protocol.response_meta import ResponseMeta
from api.streaming.respond import respond
from api.streaming.sse import sse_typed_events

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/messages")
async def create_message(request: Request, context: Context) -> Response:
    """Render the conversation with the chat template, generate, and answer as a message object
    or as its stream of events."""
    body = await read_body(request, MessagesRequest)
    model = context.resolve_model(body.model)
    engine = context.engine
    meta = ResponseMeta(id=f"msg_{uuid.uuid4().hex}", created=int(time.time()), model=model.name)
    _, generation = await prepare(engine.tokenizer, context.config, meta.id,
                                  partial(translate, body, model.lora_name), lambda inputs: inputs)
    tool_calling = generation.constraints.tool_calling
    options = MessageOptions(
        tool_calling=tool_calling,
        on_tool_calls=tool_call_counter(request, tool_calling, generation.engine_request.arrival_time),
        stop_sequences=tuple(body.stop_sequences or ()),
    )
    builder = MessageBuilder(meta, options)
    return await respond(
        request,
        context,
        [generation.engine_request],
        bool(body.stream),
        chunks=partial(message_events, builder=builder),
        whole=partial(whole_message, builder=builder),
        sse=sse_typed_events,
        grammar_param=generation.constraints.grammar_param,
        reads_calls=options.on_tool_calls is not None,
    )


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, context: Context) -> CountTokensResult:
    """The prompt tokens /v1/messages would send to the model for the same body (system prompt,
    tools and template included): its usage's input_tokens + cache_read_input_tokens +
    cache_creation_input_tokens. The tool and format fields are checked as /v1/messages does."""
    body = await read_body(request, CountTokensRequest)
    model = context.resolve_model(body.model)
    engine = context.engine

    def count() -> int:
        inputs = translate(body, model.lora_name)
        request_constraints(inputs, context.config)
        return len(render_prompt_sync(engine.tokenizer, context.config, inputs).token_ids)

    return CountTokensResult(input_tokens=await asyncio.to_thread(count))

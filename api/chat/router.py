"""POST /v1/chat/completions: translate the body, prepare the generation, answer (JSON or SSE)."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api.chat.output import ChatOutputOptions, chat_chunks, chat_completion
from api.chat.protocol import ChatCompletionRequest
from api.chat.translate import translate
from api.http.context import Context
from api.generation.prepare import prepare
from api.http.auth import require_api_key
from api.http.body import read_body
from api.observability.tool_call_metrics import tool_call_counter
from api.protocol.logprobs_output import LogprobFormatter
from api.protocol.response_meta import ResponseMeta
from api.streaming.respond import respond

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request, context: Context) -> Response:
    """Render the messages with the chat template, generate, and answer as chat.completion or SSE chunks."""
    body = await read_body(request, ChatCompletionRequest)
    model = context.resolve_model(body.model)
    engine = context.engine
    meta = ResponseMeta.new("chatcmpl", model.name)
    chat, generation = await prepare(engine.tokenizer, context.config, meta.id,
                                     partial(translate, body, model.lora_name), lambda chat: chat.inputs)
    tool_calling = generation.constraints.tool_calling
    options = ChatOutputOptions(
        n=generation.engine_request.sampling_params.n,
        logprobs=chat.num_logprobs is not None,
        include_usage=chat.include_usage,
        continuous_usage=chat.continuous_usage,
        tool_calling=tool_calling,
        on_tool_calls=tool_call_counter(request, tool_calling, generation.engine_request.arrival_time),
    )
    fmt = LogprobFormatter(engine.tokenizer)
    return await respond(
        request,
        context,
        [generation.engine_request],
        chat.stream,
        chunks=partial(chat_chunks, meta=meta, options=options, fmt=fmt),
        whole=partial(chat_completion, meta=meta, options=options, fmt=fmt),
        grammar_param=generation.constraints.grammar_param,
        reads_calls=options.on_tool_calls is not None,
    )

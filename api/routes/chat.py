"""POST /v1/chat/completions."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api.http.auth import require_api_key
from api.chat_generation import ChatInputs, prepare_chat_generation
from api.chat_output import ChatOutputOptions, chat_chunks, chat_completion
from api.chat_render import RenderOptions
from api.context import Context
from api.grammar_from_request import grammar_errors_name
from api.logprobs_output import LogprobFormatter
from api.protocol.chat_request import ChatCompletionRequest
from api.http.body import read_body
from api.response_meta import ResponseMeta
from api.sampling_from_request import chat_logprobs, sampling_params_from_request
from api.streaming.respond import respond
from api.observability.tool_call_metrics import tool_call_counter
from api.tool_choice import chat_constraints

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/chat/completions")
async def create_chat_completion(request: Request, context: Context) -> Response:
    """Render the messages with the chat template, generate, and answer as chat.completion or SSE chunks."""
    body = await read_body(request, ChatCompletionRequest)
    model = context.resolve_model(body.model)
    engine = context.engine
    options = RenderOptions(
        add_generation_prompt=body.add_generation_prompt is not False,
        continue_final_message=bool(body.continue_final_message),
        chat_template_kwargs=body.chat_template_kwargs,
        chat_template=context.config.chat_template,
        add_special_tokens=bool(body.add_special_tokens),
        tool_call_parser=context.config.tool_call_parser,
    )
    num_logprobs = chat_logprobs(body.logprobs, body.top_logprobs)
    meta = ResponseMeta.new("chatcmpl", model.name)
    inputs = ChatInputs(
        messages=body.messages,
        tools=body.tools,
        render=options,
        requested_max_tokens=body.requested_max_tokens(),
        constraints=partial(chat_constraints, body, context.config),
        sampling=lambda max_tokens: sampling_params_from_request(
            body, max_tokens=max_tokens, logprobs=num_logprobs, vocab_size=engine.vocab_size
        ),
    )
    generation = await prepare_chat_generation(context, meta.id, model, inputs)
    constraints = generation.constraints
    output_options = ChatOutputOptions(
        n=generation.engine_request.sampling_params.n,
        logprobs=num_logprobs is not None,
        include_usage=body.include_usage(),
        continuous_usage=body.continuous_usage(),
        tool_calling=constraints.tool_calling,
        on_tool_calls=tool_call_counter(request, constraints.tool_calling),
    )
    fmt = LogprobFormatter(engine.tokenizer)
    with grammar_errors_name(constraints.grammar):
        return await respond(
            request,
            context,
            [generation.engine_request],
            bool(body.stream),
            chunks=partial(chat_chunks, meta=meta, options=output_options, fmt=fmt),
            whole=partial(chat_completion, meta=meta, options=output_options, fmt=fmt),
        )

"""POST /v1/completions: tokenize the prompts, build their engine requests, answer (JSON or SSE)."""

from __future__ import annotations

import asyncio
from functools import partial

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api.completions.output import CompletionOutputOptions, completion, completion_chunks
from api.completions.prompts import tokenize_prompts
from api.completions.protocol import CompletionRequest
from api.completions.translate import CompletionTarget, check_best_of_and_echo, engine_requests
from api.http.context import Context
from api.http.auth import require_api_key
from api.http.body import read_body
from api.protocol.format_grammar import format_grammar
from api.protocol.logprobs_output import LogprobFormatter
from api.protocol.response_meta import ResponseMeta
from api.streaming.respond import respond

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions")
async def create_completion(request: Request, context: Context) -> Response:
    """Tokenize the prompt(s), generate `n` choices each, and answer as text_completion or SSE chunks."""
    body = await read_body(request, CompletionRequest)
    model = context.resolve_model(body.model)
    check_best_of_and_echo(body)
    grammar = await asyncio.to_thread(format_grammar, body)
    engine = context.engine
    prompts = await tokenize_prompts(engine.tokenizer, body.prompt, add_special_tokens=body.add_special_tokens is not False)
    meta = ResponseMeta.new("cmpl", model.name)
    target = CompletionTarget(meta.id, model.lora_name, context.config.close_structured_outputs)
    requests = engine_requests(body, prompts, grammar, target)
    output_options = CompletionOutputOptions(
        n=body.n or 1,
        echo=bool(body.echo),
        logprobs=body.logprobs is not None,
        include_usage=body.include_usage(),
        continuous_usage=body.continuous_usage(),
    )
    fmt = LogprobFormatter(engine.tokenizer)
    return await respond(
        request,
        context,
        requests,
        bool(body.stream),
        chunks=partial(completion_chunks, meta=meta, prompts=prompts, options=output_options, fmt=fmt),
        whole=partial(completion, meta=meta, prompts=prompts, options=output_options, fmt=fmt),
        grammar_param=grammar.param if grammar is not None else None,
    )


"""POST /v1/completions."""

from __future__ import annotations

import asyncio
import time
from functools import partial

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from api.http.auth import require_api_key
from api.completions.output import CompletionOutputOptions, completion, completion_chunks
from api.completions.prompts import tokenize_prompts
from api.context import Context
from api.errors import InvalidRequest, NotSupported
from api.generation.constraints import grammar_errors_name
from api.generation.prepare import resolve_max_tokens
from api.protocol.format_grammar import format_grammar
from api.protocol.logprobs_output import LogprobFormatter
from api.completions.protocol import CompletionRequest
from api.http.body import read_body
from api.protocol.response_meta import ResponseMeta
from api.protocol.sampling import sampling_params_from_request
from api.streaming.respond import respond
from engine import EngineRequest

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions")
async def create_completion(request: Request, context: Context) -> Response:
    """Tokenize the prompt(s), generate `n` choices each, and answer as text_completion or SSE chunks."""
    body = await read_body(request, CompletionRequest)
    model = context.resolve_model(body.model)
    _check_best_of_and_echo(body)
    grammar = await asyncio.to_thread(format_grammar, body)
    engine = context.engine
    prompts = await tokenize_prompts(
        engine.tokenizer,
        body.prompt,
        engine.vocab_size,
        add_special_tokens=body.add_special_tokens is not False,
    )
    meta = ResponseMeta.new("cmpl", model.name)
    engine_requests = []
    for i, prompt in enumerate(prompts):
        max_tokens = resolve_max_tokens(
            body.max_tokens,
            len(prompt.token_ids),
            engine.max_model_len,
            "prompt" if len(prompts) == 1 else f"prompt[{i}]",
        )
        params = sampling_params_from_request(
            body, max_tokens=max_tokens, logprobs=body.logprobs, vocab_size=engine.vocab_size
        )
        request_id = meta.id if len(prompts) == 1 else f"{meta.id}-{i}"
        engine_requests.append(
            EngineRequest(
                request_id,
                prompt.token_ids,
                params,
                grammar.spec if grammar is not None else None,
                model.lora_name,
                time.monotonic(),
                close_grammar=grammar is not None and context.config.close_structured_outputs,
            )
        )
    output_options = CompletionOutputOptions(
        n=body.n or 1,
        echo=bool(body.echo),
        logprobs=body.logprobs is not None,
        include_usage=body.include_usage(),
        continuous_usage=body.continuous_usage(),
    )
    fmt = LogprobFormatter(engine.tokenizer)
    with grammar_errors_name(grammar):
        return await respond(
            request,
            context,
            engine_requests,
            bool(body.stream),
            chunks=partial(completion_chunks, meta=meta, prompts=prompts, options=output_options, fmt=fmt),
            whole=partial(completion, meta=meta, prompts=prompts, options=output_options, fmt=fmt),
        )


def _check_best_of_and_echo(body: CompletionRequest) -> None:
    n = body.n or 1
    if body.best_of is not None and body.best_of < n:
        raise InvalidRequest(f"best_of ({body.best_of}) must be >= n ({n})", param="best_of")
    if body.best_of is not None and body.best_of > n:
        raise NotSupported("best_of greater than n is not supported", param="best_of")
    if body.echo and body.logprobs is not None:
        raise NotSupported("echo together with logprobs (prompt logprobs) is not supported", param="echo")

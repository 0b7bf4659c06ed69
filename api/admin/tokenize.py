"""POST /tokenize and /detokenize (vLLM shapes; outside /v1, so no API key needed).

Messages are rendered by `api/generation/render.py`, the code chat uses: with `tools` and
`tool_choice` the token ids are exactly the prompt a chat request with the same fields sends.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from api.admin.protocol import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from api.http.context import Context
from api.generation.inputs import GenerationInputs, RenderOptions
from api.generation.render import render_prompt
from api.http.body import read_body
from api.protocol.conversation import conversation, tool_inputs
from engine import SamplingParams

router = APIRouter()


@router.post("/tokenize")
async def tokenize(request: Request, context: Context) -> TokenizeResponse:
    """Token ids of a text `prompt`, or of `messages` rendered with the chat template."""
    body = await read_body(request, TokenizeRequest)
    context.resolve_model(body.model)
    engine = context.engine
    if body.messages is not None:
        inputs = GenerationInputs(
            messages=conversation(body.messages),
            sampling=SamplingParams(max_tokens=None),
            tools=tool_inputs(body.tools, body.tool_choice, None),
            render=RenderOptions(
                add_generation_prompt=body.add_generation_prompt is not False,
                continue_final_message=bool(body.continue_final_message),
                chat_template_kwargs=body.chat_template_kwargs,
                add_special_tokens=bool(body.add_special_tokens),
            ),
        )
        token_ids = (await render_prompt(engine.tokenizer, context.config, inputs)).token_ids
    else:
        assert body.prompt is not None
        add_special = body.add_special_tokens is not False
        token_ids = await asyncio.to_thread(
            engine.tokenizer.encode, body.prompt, add_special_tokens=add_special
        )
    token_strs = engine.tokenizer.convert_ids_to_tokens(token_ids) if body.return_token_strs else None
    return TokenizeResponse(
        count=len(token_ids),
        max_model_len=engine.max_model_len,
        tokens=list(token_ids),
        token_strs=token_strs,
    )


@router.post("/detokenize")
async def detokenize(request: Request, context: Context) -> DetokenizeResponse:
    """The text of a list of token ids (400 for ids outside the vocabulary)."""
    body = await read_body(request, DetokenizeRequest)
    context.resolve_model(body.model)
    engine = context.engine
    engine.check_token_ids(body.tokens, "tokens")
    text = await asyncio.to_thread(engine.tokenizer.decode, body.tokens)
    return DetokenizeResponse(prompt=text)

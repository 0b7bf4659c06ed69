"""A conversation -> the EngineRequest that answers it: the steps /v1/chat/completions and
/v1/responses share (constraints, chat template, output budget, sampling).

Each endpoint turns its own body into chat messages, chat-shaped tools and SamplingParams; from
there on both run the same code, so a fix to rendering, tool grammars or the context check applies
to both.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from api.chat_render import RenderOptions, render_chat_prompt
from api.context import ResolvedModel, ServerContext
from api.protocol.messages import ChatMessage, Tool
from api.sampling_from_request import resolve_max_tokens
from api.tool_choice import ChatConstraints, sampling_for_tools
from engine import EngineRequest
from engine import SamplingParams


@dataclass(frozen=True, slots=True)
class ChatInputs:
    """What an endpoint hands over: the conversation, its tools (rendered when the constraints say
    so), how to render, the requested output budget (None: the rest of the context), and two
    callbacks: `constraints()` (run off the event loop: it walks client schemas) and
    `sampling(max_tokens)`."""

    messages: Sequence[ChatMessage]
    tools: Sequence[Tool] | None
    render: RenderOptions
    requested_max_tokens: int | None
    constraints: Callable[[], ChatConstraints]
    sampling: Callable[[int], SamplingParams]


@dataclass(frozen=True, slots=True)
class ChatGeneration:
    """The engine request and the constraints that decide how its output is read."""

    engine_request: EngineRequest
    constraints: ChatConstraints


async def prepare_chat_generation(
    context: ServerContext, request_id: str, model: ResolvedModel, inputs: ChatInputs
) -> ChatGeneration:
    """Decide the constraints, render and tokenize the conversation, check it fits the context and
    build the EngineRequest (`request_id`, the model's LoRA adapter).

    Raises the 400s of its steps: InvalidRequest / NotSupported (tools, formats, template),
    ContextLengthExceeded (param `inputs.render.prompt_param`), InvalidSamplingParams.
    """
    engine = context.engine
    constraints = await asyncio.to_thread(inputs.constraints)
    tools = inputs.tools if constraints.render_tools else None
    prompt = await render_chat_prompt(engine.tokenizer, inputs.messages, tools, inputs.render)
    max_tokens = resolve_max_tokens(
        inputs.requested_max_tokens, len(prompt.token_ids), engine.max_model_len, inputs.render.prompt_param
    )
    params = sampling_for_tools(constraints, inputs.sampling(max_tokens))
    grammar = constraints.grammar
    engine_request = EngineRequest(
        request_id,
        prompt.token_ids,
        params,
        grammar.spec if grammar is not None else None,
        model.lora_name,
        time.monotonic(),
        close_grammar=constraints.close_grammar,
    )
    return ChatGeneration(engine_request, constraints)

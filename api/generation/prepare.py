"""GenerationInputs -> the EngineRequest that answers them: constraints, prompt, output budget,
sampling. Chat and Responses both come through here, so a fix to rendering, tool grammars or the
context check applies to both. The slow steps (schemas, template, tokenizer) run off the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from api.config import ServerConfig
from api.generation.constraints import Constraints, request_constraints
from api.generation.inputs import GenerationInputs
from api.generation.render import render_prompt
from engine import ContextLengthExceeded, EngineRequest


@dataclass(frozen=True, slots=True)
class Generation:
    """The engine request and the constraints that decide how its output is read."""

    engine_request: EngineRequest
    constraints: Constraints


async def prepare(
    tokenizer: Any, max_model_len: int, config: ServerConfig, request_id: str, inputs: GenerationInputs
) -> Generation:
    """Decide the constraints, render and tokenize the conversation, fit the output budget into
    the context and build the EngineRequest `request_id` (on `inputs.adapter`).

    Raises the 400s of its steps: InvalidRequest / NotSupported (tools, formats, template),
    ContextLengthExceeded (param `inputs.render.prompt_param`), InvalidSamplingParams.
    """
    constraints = await asyncio.to_thread(request_constraints, inputs, config)
    prompt = await render_prompt(tokenizer, config, inputs)
    requested = inputs.sampling.max_tokens if inputs.max_tokens_requested else None
    max_tokens = resolve_max_tokens(requested, len(prompt.token_ids), max_model_len, inputs.render.prompt_param)
    params = constraints.sampling(dataclasses.replace(inputs.sampling, max_tokens=max_tokens))
    grammar = constraints.grammar
    engine_request = EngineRequest(
        request_id,
        prompt.token_ids,
        params,
        grammar.spec if grammar is not None else None,
        inputs.adapter,
        time.monotonic(),
        close_grammar=constraints.close_grammar,
        cache_salt=inputs.cache_salt,
    )
    return Generation(engine_request, constraints)


def resolve_max_tokens(
    requested: int | None, num_prompt_tokens: int, max_model_len: int, prompt_param: str
) -> int:
    """The output token budget: `requested`, or what is left of the context when None.

    Raises ContextLengthExceeded (param `prompt_param`) naming max_model_len, the prompt's token
    count and max_tokens when prompt + max_tokens does not fit (or the prompt alone fills it).
    """
    if requested is None:
        if num_prompt_tokens >= max_model_len:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
                f"{num_prompt_tokens} tokens, which leaves no room for output. Shorten the prompt.",
                param=prompt_param,
            )
        return max_model_len - num_prompt_tokens
    if num_prompt_tokens + requested > max_model_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + requested} tokens ({num_prompt_tokens} in the prompt, {requested} for "
            f"max_tokens). Reduce the prompt or max_tokens.",
            param=prompt_param,
        )
    return requested

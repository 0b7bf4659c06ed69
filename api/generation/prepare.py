"""GenerationInputs -> the EngineRequest that answers them: constraints, prompt, sampling. Chat,
Responses and Messages all come through here, so a fix to rendering or tool grammars applies to
each. The slow steps (schemas, template, tokenizer) run off the event loop. The prompt's token ids
and the output budget are checked against the model by the engine (`LLMEngine.validate`), once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from api.config import ServerConfig
from api.generation.constraints import Constraints, request_constraints
from api.generation.inputs import GenerationInputs
from api.generation.render import render_prompt
from engine import EngineRequest


@dataclass(frozen=True, slots=True)
class Generation:
    """The engine request and the constraints that decide how its output is read."""

    engine_request: EngineRequest
    constraints: Constraints


async def prepare(tokenizer: Any, config: ServerConfig, request_id: str, inputs: GenerationInputs) -> Generation:
    """Decide the constraints, render and tokenize the conversation and build the EngineRequest
    `request_id` (on `inputs.adapter`); its prompt is named `inputs.render.prompt_param` in the
    engine's 400s (context length).

    Raises the 400s of its steps: InvalidRequest / NotSupported (tools, formats, template).
    """
    constraints = await asyncio.to_thread(request_constraints, inputs, config)
    prompt = await render_prompt(tokenizer, config, inputs)
    params = constraints.sampling(inputs.sampling)
    grammar = constraints.grammar
    engine_request = EngineRequest(
        request_id,
        prompt.token_ids,
        params,
        grammar.spec if grammar is not None else None,
        inputs.adapter,
        time.monotonic(),
        close_grammar=constraints.close_grammar,
        prompt_param=inputs.render.prompt_param,
        cache_salt=inputs.cache_salt,
    )
    return Generation(engine_request, constraints)

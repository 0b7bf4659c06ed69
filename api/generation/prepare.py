"""GenerationInputs -> the EngineRequest that answers them: constraints, prompt, sampling. Chat,
Responses and Messages all come through here, so a fix to rendering or tool grammars applies to
each. The slow steps (the translation of the body, schemas, template, tokenizer) run off the
event loop, in one worker-thread call: under load each hop between the loop and a worker waits for
the GIL behind the engine thread, so one hop rather than three. The prompt's token ids
and the output budget are checked against the model by the engine (`LLMEngine.validate`), once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, TypeVar

from api.config import ServerConfig
from api.generation.constraints import Constraints, request_constraints
from api.generation.inputs import GenerationInputs
from api.generation.render import render_prompt_sync
from engine import EngineRequest

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Generation:
    """The engine request and the constraints that decide how its output is read."""

    engine_request: EngineRequest
    constraints: Constraints


async def prepare(tokenizer: Any, config: ServerConfig, request_id: str, translate: Callable[[], T],
                  inputs_of: Callable[[T], GenerationInputs]) -> tuple[T, Generation]:
    """Run `translate` (the endpoint's body -> its translation) and `build_generation` on
    `inputs_of(translation)` in one worker-thread call; returns (translation, Generation).

    Raises what `translate` raises (the endpoint's 400s) and `build_generation`'s 400s.
    """
    def run() -> tuple[T, Generation]:
        translated = translate()
        return translated, build_generation(tokenizer, config, request_id, inputs_of(translated))

    return await asyncio.to_thread(run)


def build_generation(tokenizer: Any, config: ServerConfig, request_id: str, inputs: GenerationInputs) -> Generation:
    """Decide the constraints, render and tokenize the conversation and build the EngineRequest
    `request_id` (on `inputs.adapter`); its prompt is named `inputs.render.prompt_param` in the
    engine's 400s (context length). Blocks (schemas, template, tokenizer): call it from a worker
    thread, as `prepare` does.

    Raises the 400s of its steps: InvalidRequest / NotSupported (tools, formats, template).
    """
    constraints = request_constraints(inputs, config)
    prompt = render_prompt_sync(tokenizer, config, inputs)
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

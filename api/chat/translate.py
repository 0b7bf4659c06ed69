"""A /v1/chat/completions body -> GenerationInputs, and how its answer is shaped (once, here)."""

from __future__ import annotations

from dataclasses import dataclass

from api.chat.protocol import ChatCompletionRequest
from api.generation.inputs import GenerationInputs, RenderOptions
from api.protocol.conversation import conversation, tool_inputs
from api.protocol.format_grammar import format_grammar, grammar_options
from api.protocol.sampling import chat_logprobs, sampling_params_from_request


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What a chat body means: the generation inputs and the answer's options (logprobs per
    token: None for no logprobs; usage at the end of a stream; running usage on every chunk)."""

    inputs: GenerationInputs
    num_logprobs: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool


def translate(body: ChatCompletionRequest, adapter: str | None) -> ChatRequest:
    """The generation inputs of `body` on `adapter` (None: the base model). Walks the response
    format's schema: call it off the event loop.

    Raises InvalidRequest for top_logprobs without logprobs, format conflicts and malformed
    schemas; InvalidSamplingParams (param: the field sent) for out-of-range or inconsistent values
    (token ids are the engine's to check).
    """
    num_logprobs = chat_logprobs(body.logprobs, body.top_logprobs)
    max_tokens_field = "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens"
    sampling = sampling_params_from_request(
        body, max_tokens=body.requested_max_tokens(), logprobs=num_logprobs,
        names={"max_tokens": max_tokens_field, "logprobs": "top_logprobs"},
    )
    inputs = GenerationInputs(
        messages=conversation(body.messages),
        sampling=sampling,
        tools=tool_inputs(body.tools, body.tool_choice, body.parallel_tool_calls),
        output_format=format_grammar(body),
        grammar_options=grammar_options(body.structured_outputs),
        render=RenderOptions(
            add_generation_prompt=body.add_generation_prompt is not False,
            continue_final_message=bool(body.continue_final_message),
            chat_template_kwargs=body.chat_template_kwargs,
            add_special_tokens=bool(body.add_special_tokens),
        ),
        adapter=adapter,
        cache_salt=body.cache_salt,
    )
    return ChatRequest(inputs, num_logprobs, bool(body.stream), body.include_usage(), body.continuous_usage())

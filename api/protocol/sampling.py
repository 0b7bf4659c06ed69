"""The sampling fields of chat and completions -> SamplingParams. Types are pydantic's, ranges
SamplingParams', and token ids and the context length the engine's (`LLMEngine.validate`)."""

from __future__ import annotations

from api.errors import InvalidRequest
from api.protocol.sampling_fields import SamplingFields
from engine import SamplingParams


def sampling_params_from_request(
    request: SamplingFields, *, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    """Build SamplingParams from the shared request fields, defaults for nulls.

    `max_tokens` None: what the prompt leaves of the context. `logprobs`: alternatives per token
    (None: no logprobs). Raises InvalidSamplingParams for inconsistent values (e.g. min_tokens >
    max_tokens).
    """
    return SamplingParams(
        n=request.n or 1,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p,
        top_k=-1 if request.top_k is None else request.top_k,
        min_p=request.min_p or 0.0,
        seed=request.seed,
        presence_penalty=request.presence_penalty or 0.0,
        frequency_penalty=request.frequency_penalty or 0.0,
        repetition_penalty=1.0 if request.repetition_penalty is None else request.repetition_penalty,
        logit_bias={int(token): value for token, value in (request.logit_bias or {}).items()},
        min_tokens=request.min_tokens or 0,
        max_tokens=max_tokens,
        ignore_eos=bool(request.ignore_eos),
        stop=tuple(request.stop_list()),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        include_stop_str_in_output=bool(request.include_stop_str_in_output),
        logprobs=logprobs,
        skip_special_tokens=True if request.skip_special_tokens is None else request.skip_special_tokens,
    )


def chat_logprobs(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """Alternatives per token for a chat request; top_logprobs needs logprobs true (as OpenAI)."""
    if top_logprobs is not None and not logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    return (top_logprobs or 0) if logprobs else None

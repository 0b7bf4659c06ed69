"""Request sampling fields -> SamplingParams. Types are pydantic's, ranges SamplingParams' (with
the field named as the client sent it), and token ids and the context length the engine's
(`LLMEngine.validate`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api.errors import InvalidRequest
from api.protocol.sampling_fields import SamplingFields
from engine import InvalidSamplingParams, SamplingParams


def sampling_params(names: Mapping[str, str], **values: Any) -> SamplingParams:
    """SamplingParams(**values), whose errors name the field the client sent.

    `names` maps a SamplingParams field to the request field it came from where the two differ
    (max_tokens -> max_completion_tokens, logprobs -> top_logprobs). Raises InvalidSamplingParams
    with that `param` and a message starting with it.
    """
    try:
        return SamplingParams(**values)
    except InvalidSamplingParams as exc:
        sent = names.get(exc.param or "")
        if sent is None or exc.param is None:
            raise
        raise InvalidSamplingParams(sent + exc.message.removeprefix(exc.param), param=sent) from None


def sampling_params_from_request(
    request: SamplingFields, *, max_tokens: int | None, logprobs: int | None, names: Mapping[str, str]
) -> SamplingParams:
    """Build SamplingParams from the shared request fields, defaults for nulls.

    `max_tokens` None: what the prompt leaves of the context. `logprobs`: alternatives per token
    (None: no logprobs). `names`: see `sampling_params`. Raises InvalidSamplingParams for an
    out-of-range or inconsistent value (e.g. min_tokens > max_tokens).
    """
    return sampling_params(
        names,
        n=1 if request.n is None else request.n,
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

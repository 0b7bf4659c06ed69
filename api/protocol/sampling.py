"""The sampling fields of chat and completions -> SamplingParams (the context-length check is in
`api/generation/prepare.py`)."""

from __future__ import annotations

from api.errors import InvalidRequest
from api.protocol.sampling_fields import SamplingFields
from engine import SamplingParams


def sampling_params_from_request(
    request: SamplingFields, *, max_tokens: int, logprobs: int | None, vocab_size: int
) -> SamplingParams:
    """Build SamplingParams from the shared request fields, defaults for nulls.

    `logprobs`: alternatives per token (None: no logprobs). Raises InvalidRequest for token ids
    outside the vocabulary, InvalidSamplingParams for inconsistent values (e.g. min_tokens > max_tokens).
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
        logit_bias=_logit_bias(request.logit_bias, vocab_size),
        min_tokens=request.min_tokens or 0,
        max_tokens=max_tokens,
        ignore_eos=bool(request.ignore_eos),
        stop=tuple(request.stop_list()),
        stop_token_ids=tuple(_check_ids(request.stop_token_ids or [], vocab_size, "stop_token_ids")),
        include_stop_str_in_output=bool(request.include_stop_str_in_output),
        logprobs=logprobs,
        skip_special_tokens=True if request.skip_special_tokens is None else request.skip_special_tokens,
    )


def chat_logprobs(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """Alternatives per token for a chat request; top_logprobs needs logprobs true (as OpenAI)."""
    if top_logprobs is not None and not logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    return (top_logprobs or 0) if logprobs else None


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float]:
    result = {int(token): value for token, value in (bias or {}).items()}
    _check_ids(list(result), vocab_size, "logit_bias")
    return result


def _check_ids(token_ids: list[int], vocab_size: int, param: str) -> list[int]:
    for token_id in token_ids:
        if not 0 <= token_id < vocab_size:
            raise InvalidRequest(
                f"token id {token_id} is outside the vocabulary [0, {vocab_size})", param=param
            )
    return token_ids

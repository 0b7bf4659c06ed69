"""Request fields -> SamplingParams, and the context-length check (prompt + max_tokens)."""

from __future__ import annotations

from api.http.errors import InvalidRequest
from api.protocol.sampling_fields import SamplingFields
from engine import ContextLengthExceeded
from engine import SamplingParams


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

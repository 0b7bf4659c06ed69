"""What a request is checked against on this model, in one place: the vocabulary and the context.

The api checks types (pydantic) and SamplingParams checks ranges; `ModelLimits.validate`
(run by `LLMEngine.validate`, once per request) checks every token id a request carries and its
prompt + output budget against the model. The messages are the ones clients have always seen
(OpenAI's "maximum context length" wording); `param` names the request field at fault.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engine.errors import ContextLengthExceeded, InvalidSamplingParams
from engine.request import EngineRequest


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """The model's vocabulary size (the logits width, token ids in `[0, vocab_size)`) and
    `max_model_len` (prompt + output tokens per sequence)."""

    vocab_size: int
    max_model_len: int

    def check_token_ids(self, token_ids: Iterable[int], param: str) -> None:
        """Raise InvalidSamplingParams(param) naming the first id outside `[0, vocab_size)`."""
        for token_id in token_ids:
            if not 0 <= token_id < self.vocab_size:
                raise InvalidSamplingParams(
                    f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})", param=param
                )

    def max_tokens(self, request: EngineRequest) -> int:
        """The request's output budget in tokens: `sampling_params.max_tokens`, or what the prompt
        leaves of the context when it is None. Not checked (see `validate`)."""
        requested = request.sampling_params.max_tokens
        if requested is None:
            return self.max_model_len - len(request.prompt_token_ids)
        return requested

    def validate(self, request: EngineRequest) -> None:
        """Raise for a request this model cannot run; no side effects.

        InvalidSamplingParams for an empty prompt (param `request.prompt_param`), a token id outside
        the vocabulary in the prompt, `logit_bias` or `stop_token_ids` (param: that field), or a
        `min_tokens` above what the context leaves; ContextLengthExceeded (param
        `request.prompt_param`) naming max_model_len, the prompt's length and max_tokens when
        prompt + max_tokens does not fit, or when the prompt alone fills the context.
        """
        params = request.sampling_params
        num_prompt = len(request.prompt_token_ids)
        if num_prompt == 0:
            raise InvalidSamplingParams("prompt must not be empty", param=request.prompt_param)
        self.check_token_ids(request.prompt_token_ids, request.prompt_param)
        self.check_token_ids(params.logit_bias, "logit_bias")
        self.check_token_ids(params.stop_token_ids, "stop_token_ids")
        limit = self.max_model_len
        if params.max_tokens is None:
            if num_prompt >= limit:
                raise ContextLengthExceeded(
                    f"This model's maximum context length is {limit} tokens, but the prompt has "
                    f"{num_prompt} tokens, which leaves no room for output. Shorten the prompt.",
                    param=request.prompt_param,
                )
            if params.min_tokens > limit - num_prompt:
                raise InvalidSamplingParams("min_tokens must be in [0, max_tokens]", param="min_tokens")
        elif num_prompt + params.max_tokens > limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{num_prompt + params.max_tokens} tokens ({num_prompt} in the prompt, {params.max_tokens} for "
                f"max_tokens). Reduce the prompt or max_tokens.",
                param=request.prompt_param,
            )

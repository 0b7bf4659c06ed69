"""A /v1/completions body -> its EngineRequests (one per prompt, each with `n` choices), once.

Completions have no conversation: the prompts are tokenized as they are (`prompts.py`), so this
is the one endpoint that builds EngineRequests without `api/generation/prepare.py`; the context
check (`resolve_max_tokens`) and the format grammar are the ones chat uses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from api.completions.prompts import PromptInput
from api.completions.protocol import CompletionRequest
from api.errors import InvalidRequest, NotSupported
from api.generation.inputs import RequestGrammar
from api.generation.prepare import resolve_max_tokens
from api.protocol.sampling import sampling_params_from_request
from engine import EngineRequest


def check_best_of_and_echo(body: CompletionRequest) -> None:
    """Raise InvalidRequest for best_of < n, NotSupported for best_of > n and echo with logprobs."""
    n = body.n or 1
    if body.best_of is not None and body.best_of < n:
        raise InvalidRequest(f"best_of ({body.best_of}) must be >= n ({n})", param="best_of")
    if body.best_of is not None and body.best_of > n:
        raise NotSupported("best_of greater than n is not supported", param="best_of")
    if body.echo and body.logprobs is not None:
        raise NotSupported("echo together with logprobs (prompt logprobs) is not supported", param="echo")


@dataclass(frozen=True, slots=True)
class CompletionTarget:
    """Where a completions request runs: the engine request id prefix, the adapter (None: base
    model), the context length and vocabulary size, and whether to close a cut grammar."""

    request_id: str
    adapter: str | None
    max_model_len: int
    vocab_size: int
    close_grammar: bool


def engine_requests(
    body: CompletionRequest, prompts: list[PromptInput], grammar: RequestGrammar | None, target: CompletionTarget
) -> list[EngineRequest]:
    """One EngineRequest per prompt (ids `target.request_id`, or `-i` suffixed for several prompts).

    Raises ContextLengthExceeded (param `prompt` / `prompt[i]`), InvalidRequest for token ids
    outside the vocabulary, InvalidSamplingParams for inconsistent values.
    """
    requests = []
    for i, prompt in enumerate(prompts):
        param = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        max_tokens = resolve_max_tokens(body.max_tokens, len(prompt.token_ids), target.max_model_len, param)
        params = sampling_params_from_request(
            body, max_tokens=max_tokens, logprobs=body.logprobs, vocab_size=target.vocab_size
        )
        request_id = target.request_id if len(prompts) == 1 else f"{target.request_id}-{i}"
        requests.append(
            EngineRequest(
                request_id,
                prompt.token_ids,
                params,
                grammar.spec if grammar is not None else None,
                target.adapter,
                time.monotonic(),
                close_grammar=grammar is not None and target.close_grammar,
                cache_salt=body.cache_salt,
            )
        )
    return requests

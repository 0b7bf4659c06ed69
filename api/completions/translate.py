"""A /v1/completions body -> its EngineRequests (one per prompt, each with `n` choices), once.

Completions have no conversation: the prompts are tokenized as they are (`prompts.py`), so this
is the one endpoint that builds EngineRequests without `api/generation/prepare.py`; the format
grammar is the one chat uses, and the engine checks ids and context length as for every request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from api.completions.prompts import PromptInput
from api.completions.protocol import CompletionRequest
from api.errors import InvalidRequest, NotSupported
from api.generation.inputs import RequestGrammar
from api.protocol.sampling import sampling_params_from_request
from engine import EngineRequest


def check_best_of_and_echo(body: CompletionRequest) -> None:
    """Raise InvalidRequest for best_of < n, NotSupported for best_of > n and echo with logprobs."""
    n = 1 if body.n is None else body.n
    if body.best_of is not None and body.best_of < n:
        raise InvalidRequest(f"best_of ({body.best_of}) must be >= n ({n})", param="best_of")
    if body.best_of is not None and body.best_of > n:
        raise NotSupported("best_of greater than n is not supported", param="best_of")
    if body.echo and body.logprobs is not None:
        raise NotSupported("echo together with logprobs (prompt logprobs) is not supported", param="echo")


@dataclass(frozen=True, slots=True)
class CompletionTarget:
    """Where a completions request runs: the engine request id prefix, the adapter (None: base
    model), and whether to close a cut grammar."""

    request_id: str
    adapter: str | None
    close_grammar: bool


def engine_requests(
    body: CompletionRequest, prompts: list[PromptInput], grammar: RequestGrammar | None, target: CompletionTarget
) -> list[EngineRequest]:
    """One EngineRequest per prompt (ids `target.request_id`, or `-i` suffixed for several prompts).

    Each names its prompt `prompt` / `prompt[i]` (EngineRequest.prompt_param) for the engine's
    400s. Raises InvalidSamplingParams for out-of-range or inconsistent values.
    """
    requests = []
    params = sampling_params_from_request(body, max_tokens=body.max_tokens, logprobs=body.logprobs, names={})
    for i, prompt in enumerate(prompts):
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
                prompt_param="prompt" if len(prompts) == 1 else f"prompt[{i}]",
                cache_salt=body.cache_salt,
            )
        )
    return requests

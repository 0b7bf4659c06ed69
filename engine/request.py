"""What the api hands to the engine and what the engine hands back, per step."""

from __future__ import annotations

from dataclasses import dataclass, field

from constrained.spec import GrammarSpec
from engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One client request: prompt token ids, sampling params, optional grammar and LoRA adapter.

    `lora_name` None means the base model. `arrival_time` is time.monotonic() seconds.
    `close_grammar`: when max_tokens (or the context) is about to cut the constrained output, append
    the short completion `constrained.closing.GrammarCloser` plans instead, so the output matches
    the grammar; finish_reason stays "length". Ignored without a grammar or with logprobs.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    grammar_spec: GrammarSpec | None = None
    lora_name: str | None = None
    arrival_time: float = 0.0
    close_grammar: bool = False


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Logprob of one generated token (after masking/penalties, before temperature) and its top alternatives."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)   # (token_id, logprob), best first


@dataclass(slots=True)
class CompletionDelta:
    """What is new for one choice (`index` in 0..n-1) since the previous RequestOutput.

    `text` is the newly released text (stop strings withheld or cut); `finish_reason` is set
    once: "stop", "length", or "abort".
    """

    index: int
    token_ids: list[int]
    text: str
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None   # the stop string or stop token id that ended it


@dataclass(slots=True)
class RequestOutput:
    """One step's output for a request: deltas of the choices that advanced.

    `finished` is True once every choice has a finish_reason. Token counts are totals so far.
    `error` carries an engine-side failure for this request (the request is finished).
    """

    request_id: str
    deltas: list[CompletionDelta]
    num_prompt_tokens: int
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    finished: bool = False
    error: Exception | None = None

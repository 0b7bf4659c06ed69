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
    `prompt_param`: the request field the prompt came from ("messages", "prompt[1]", "input"),
    named by the 400s of `LLMEngine.validate` about the prompt.
    `cache_salt`: requests share prefix-cache blocks only with requests of the same salt (None:
    with every other request without one); see engine/block_hash.py.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    grammar_spec: GrammarSpec | None = None
    lora_name: str | None = None
    arrival_time: float = 0.0
    close_grammar: bool = False
    prompt_param: str = "prompt"
    cache_salt: str | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Logprob of one generated token (after penalties, logit_bias and the grammar mask, before
    temperature) and its top alternatives.

    The sampler fills the first three fields; the engine fills the last two as it releases the
    entry with its text (engine/output_logprobs.py): `text_bytes` is this token's part of the
    returned text (its whole bytes, or the part before the cut where the text ends inside it),
    `top_bytes` the vocabulary bytes of each `top` token.
    """

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)   # (token_id, logprob), best first
    text_bytes: bytes | None = None
    top_bytes: tuple[bytes, ...] = ()


@dataclass(slots=True)
class CompletionDelta:
    """What is new for one choice (`index` in 0..n-1) since the previous RequestOutput.

    `text` is the newly released text (stop strings withheld or cut); `logprobs` (when requested)
    lists exactly the tokens whose text `text` completes, in order (never EOS or a stop token; see
    engine/output_logprobs.py); `finish_reason` is set once: "stop", "length", or "abort".
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

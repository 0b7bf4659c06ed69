"""Per-request sampling parameters, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.errors import InvalidSamplingParams

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this are greedy (vLLM's epsilon): dividing float32 logits by a temperature
near or under float32's smallest normal overflows to inf, and the draw degenerates to token 0."""

MAX_N = 128
"""Most choices per request (OpenAI's limit for `n`)."""
MAX_TEMPERATURE = 2.0
"""Highest temperature (OpenAI's range is [0, 2]; Anthropic's narrower [0, 1] is its protocol's)."""
MAX_LOGPROBS = 20
"""Most alternatives per token (OpenAI's top_logprobs limit)."""
SEED_RANGE = (-(2**63), 2**64)
"""Seeds accepted, [low, high): what torch.Generator.manual_seed takes (int64 or uint64)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens for one request (OpenAI chat/completions semantics, vLLM extras).

    temperature 0.0 means greedy. `top_k` -1 or 0 disables top-k. `logit_bias` maps token id to
    an additive bias in [-100, 100]. `logprobs` is the number of top alternatives to report per
    token (None: no logprobs; 0: only the sampled token's). `max_tokens` counts output tokens
    (None: until the context is full, `ModelLimits.max_tokens`; the engine checks it against the
    prompt and max_model_len, `ModelLimits.validate`).
    `stop` strings are matched on detokenized text and never appear in the output unless
    `include_stop_str_in_output`; with a grammar, `stop` and `stop_token_ids` end the output only
    where the grammar could end it (`LLMEngine._stop_allowed`).

    The one range check of every endpoint's sampling fields (the protocols check only types):
    raises InvalidSamplingParams(param=<field>) with the message "<field> <rule>" for a value out
    of range (`_range_checks`).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    max_tokens: int | None = 16
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        for ok, param, rule in self._range_checks():
            if not ok:
                raise InvalidSamplingParams(f"{param} {rule}", param=param)

    def _range_checks(self) -> list[tuple[bool, str, str]]:
        """(in range, field, rule) per field; the message is "<field> <rule>", so a caller that
        names the field differently (chat's max_completion_tokens) can rename it (see
        `api/protocol/sampling.py`)."""
        return [
            (1 <= self.n <= MAX_N, "n", f"must be in [1, {MAX_N}]"),
            (0.0 <= self.temperature <= MAX_TEMPERATURE, "temperature",
             f"must be in [0, {MAX_TEMPERATURE:g}]"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k >= -1, "top_k", "must be -1 (disabled) or >= 0"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (self.seed is None or SEED_RANGE[0] <= self.seed < SEED_RANGE[1], "seed",
             "must be in [-2**63, 2**64)"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (self.repetition_penalty > 0.0, "repetition_penalty", "must be > 0"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (0 <= self.min_tokens and (self.max_tokens is None or self.min_tokens <= self.max_tokens), "min_tokens",
             "must be in [0, max_tokens]"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
             f"must be in [0, {MAX_LOGPROBS}]"),
            (all(-100.0 <= b <= 100.0 for b in self.logit_bias.values()), "logit_bias",
             "values must be in [-100, 100]"),
            (all(isinstance(s, str) and s for s in self.stop), "stop", "strings must be non-empty"),
        ]

    @property
    def greedy(self) -> bool:
        """True when the choice is argmax (temperature below GREEDY_TEMPERATURE)."""
        return self.temperature < GREEDY_TEMPERATURE

"""Request fields shared by /v1/chat/completions and /v1/completions (OpenAI + vLLM extras).

Every field is optional and nullable; null means the default, resolved in
`api/protocol/sampling.py`. Only types are checked here: the ranges (OpenAI's: temperature 0..2,
top_p (0, 1], n 1..128) are SamplingParams' to check, and are only documented in the schema
(`json_schema_extra`, not validated); token ids (logit_bias keys, stop_token_ids) are checked
against the vocabulary by the engine.
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from api.protocol.common import RequestModel, StreamOptions
from api.protocol.messages import ResponseFormat
from api.protocol.structured_outputs import StructuredOutputs
from api.protocol.validators import Stop
from engine import MAX_N, MAX_TEMPERATURE, SEED_RANGE

SEED_SCHEMA = {"minimum": SEED_RANGE[0], "exclusiveMaximum": SEED_RANGE[1]}
TEMPERATURE_SCHEMA = {"minimum": 0, "maximum": MAX_TEMPERATURE}
"""Documented ranges that SamplingParams checks, shared with Responses' `seed` and `temperature`."""


class SamplingFields(RequestModel):
    """Fields common to chat and text completions requests."""

    model: str | None = None
    n: int | None = Field(default=None, json_schema_extra={"minimum": 1, "maximum": MAX_N})
    max_tokens: int | None = Field(default=None, json_schema_extra={"minimum": 1})
    temperature: float | None = Field(default=None, json_schema_extra=TEMPERATURE_SCHEMA)
    top_p: float | None = Field(default=None, json_schema_extra={"exclusiveMinimum": 0, "maximum": 1})
    presence_penalty: float | None = Field(default=None, json_schema_extra={"minimum": -2, "maximum": 2})
    frequency_penalty: float | None = Field(default=None, json_schema_extra={"minimum": -2, "maximum": 2})
    logit_bias: dict[str, float] | None = None
    seed: int | None = Field(default=None, json_schema_extra=SEED_SCHEMA)
    stop: Stop = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM extensions
    top_k: int | None = Field(default=None, json_schema_extra={"minimum": -1})
    min_p: float | None = Field(default=None, json_schema_extra={"minimum": 0, "maximum": 1})
    repetition_penalty: float | None = Field(default=None, json_schema_extra={"exclusiveMinimum": 0})
    min_tokens: int | None = Field(default=None, json_schema_extra={"minimum": 0})
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    add_special_tokens: bool | None = None
    structured_outputs: StructuredOutputs | None = None
    cache_salt: str | None = Field(default=None, min_length=1)   # see engine/block_hash.py

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        # the keys' form only: the values' range [-100, 100] is SamplingParams'
        for token in value or {}:
            # ASCII digits only: str.isdigit() also accepts '²' and other digits int() refuses
            if not (token.isascii() and token.isdigit()):
                raise PydanticCustomError(
                    "invalid_value", "logit_bias keys must be token ids, got '{token}'", {"token": token}
                )
        return value

    def stop_list(self) -> list[str]:
        """`stop` as a list (a single string becomes one element)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        """Whether a stream ends with a usage-only chunk (`stream_options.include_usage`)."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """Whether every chunk carries running usage (`stream_options.continuous_usage_stats`)."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

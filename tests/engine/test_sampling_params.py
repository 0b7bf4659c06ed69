"""SamplingParams is the one range check: every field's edges are accepted, one step past them is
InvalidSamplingParams naming the field, with a message that starts with it."""

from __future__ import annotations

from typing import Any

import pytest

from engine import InvalidSamplingParams, SamplingParams

ACCEPTED = [
    {"n": 1}, {"n": 128}, {"temperature": 0.0}, {"temperature": 2.0}, {"top_p": 1e-9}, {"top_p": 1.0},
    {"top_k": -1}, {"top_k": 0}, {"min_p": 0.0}, {"min_p": 1.0}, {"seed": -(2**63)}, {"seed": 2**64 - 1},
    {"presence_penalty": -2.0}, {"frequency_penalty": 2.0}, {"repetition_penalty": 1e-9},
    {"max_tokens": 1, "min_tokens": 1}, {"max_tokens": None, "min_tokens": 10**6}, {"logprobs": 0},
    {"logprobs": 20}, {"logit_bias": {5: -100.0, 6: 100.0}},
]
REJECTED = [
    ({"n": 0}, "n"), ({"n": 129}, "n"), ({"temperature": -1e-9}, "temperature"),
    ({"temperature": 2.0001}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.0001}, "top_p"),
    ({"top_k": -2}, "top_k"), ({"min_p": -0.1}, "min_p"), ({"min_p": 1.1}, "min_p"),
    ({"seed": -(2**63) - 1}, "seed"), ({"seed": 2**64}, "seed"),
    ({"presence_penalty": 2.1}, "presence_penalty"), ({"frequency_penalty": -2.1}, "frequency_penalty"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"max_tokens": 0}, "max_tokens"),
    ({"min_tokens": -1}, "min_tokens"), ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ({"logprobs": -1}, "logprobs"), ({"logprobs": 21}, "logprobs"), ({"logit_bias": {5: 100.5}}, "logit_bias"),
    ({"stop": ("",)}, "stop"),
]


@pytest.mark.parametrize("fields", ACCEPTED, ids=str)
def test_edges_are_accepted(fields: dict[str, Any]) -> None:
    params = SamplingParams(**fields)
    assert all(getattr(params, name) == value for name, value in fields.items())


@pytest.mark.parametrize(("fields", "param"), REJECTED, ids=[str(f) for f, _ in REJECTED])
def test_one_step_out_is_rejected_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidSamplingParams) as caught:
        SamplingParams(**fields)
    assert caught.value.param == param
    assert caught.value.message.startswith(param + " ")

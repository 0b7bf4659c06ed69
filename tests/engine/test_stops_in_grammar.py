"""Stop strings and stop_token_ids under a grammar (`LLMEngine._stop_allowed`): they end the output
only where the grammar could end it. A random-weight model with SmolLM2's vocabulary writes a
forced hermes call of a tool whose arguments are only enums, so the call's text is known; stops
that occur inside that call are not matched, and the call comes out whole. In "auto" free text
(before any call trigger) the same stops cut the text exactly where they cut it without a grammar.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.llm_engine import LLMEngine
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from toolparsers import ToolSpec, get_tool_parser

TOOL = ToolSpec(name="set_mode", parameters={
    "type": "object", "required": ["mode"], "additionalProperties": False,
    "properties": {"mode": {"type": "string", "enum": ["fast", "slow"]}}})
PROMPT = list(range(10, 30))


def _run(engine: LLMEngine, params: SamplingParams, choice: str | None, backend: str) -> tuple[str, str, object]:
    """(text, finish_reason, stop_reason) of one greedy request; `choice` None: no grammar."""
    spec = None
    if choice is not None:
        parser = get_tool_parser("hermes")([TOOL])
        grammar = parser.grammar_for([TOOL], choice)
        assert grammar is not None
        spec = dataclasses.replace(grammar, backend=backend, any_whitespace=False)
    engine.add_request(EngineRequest("r", PROMPT, params, spec))
    text, reason, stop_reason = "", None, None
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            for delta in out.deltas:
                text += delta.text
                if delta.finish_reason is not None:
                    reason, stop_reason = delta.finish_reason, delta.stop_reason
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks
    return text, reason, stop_reason


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_stops_inside_a_forced_call_are_not_matched(smollm2_vocab_engine, smollm2_tokenizer, backend) -> None:
    engine = smollm2_vocab_engine
    free, reason, _ = _run(engine, SamplingParams(temperature=0, max_tokens=60), "required", backend)
    # the call's fixed layout (', ' and ': ', no free whitespace) forces everything up to the value
    assert reason == "stop" and free.startswith('<tool_call>\n{"name": "set_mode", "arguments": {"mode": "')
    parsed = get_tool_parser("hermes")([TOOL]).parse(free)
    assert [c.name for c in parsed.tool_calls] == ["set_mode"]
    # every stop occurs inside the call: none ends the output, which is the same whole call
    quote_id = smollm2_tokenizer.convert_tokens_to_ids('"')
    for params in (SamplingParams(temperature=0, max_tokens=60, stop=("name", "mode", "<tool")),
                   SamplingParams(temperature=0, max_tokens=60, stop_token_ids=(quote_id,)),
                   SamplingParams(temperature=0, max_tokens=60, stop=('"', "}"), include_stop_str_in_output=True)):
        text, reason, stop_reason = _run(engine, params, "required", backend)
        assert (text, reason, stop_reason) == (free, "stop", None), params


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
def test_stops_in_auto_free_text_cut_as_without_a_grammar(smollm2_vocab_engine, backend) -> None:
    engine = smollm2_vocab_engine
    params = SamplingParams(temperature=0, max_tokens=24)
    plain, _, _ = _run(engine, params, None, backend)
    auto, _, _ = _run(engine, params, "auto", backend)
    assert auto == plain and "<tool_call>" not in plain, "the random model writes no call"
    stop = plain[len(plain) // 2: len(plain) // 2 + 2]
    cut_plain = _run(engine, SamplingParams(temperature=0, max_tokens=24, stop=(stop,)), None, backend)
    cut_auto = _run(engine, SamplingParams(temperature=0, max_tokens=24, stop=(stop,)), "auto", backend)
    assert cut_auto == cut_plain == (plain[: plain.index(stop)], "stop", stop)

"""The endings matrix (`api/generation/ending.py`) through the real app over a real AsyncEngine:
a tiny random Llama with SmolLM2's vocabulary and tokenizer, real grammars (a forced call of each
parser's format), real stops and the real grammar closing. Each ending x each parser x chat /
Responses / Messages, whole and streamed (the official openai and anthropic clients assemble the
streams), n=2 for chat; greedy, so a stream equals its whole answer and the two choices agree.

An output that ends inside a forced call: never call markup as content; finish_reason "length" and
no call (or "tool_calls" when a call was already whole, e.g. pythonic's `[f(x="")` cut before its
"]"); a stop string or stop token id inside the call is not matched, so the call comes out whole
("tool_calls"); a call the closing completed is whole ("tool_calls", in every format: qwen3_coder's
XML parameters close with `</parameter>`, constrained/closing.py). Anthropic's stop_reason and
the Responses status follow the same decision. A call the cut dropped streamed its header and
first fragments (arguments stream as generated): the stream may show exactly that one trailing
partial call, its arguments not JSON, when the finish_reason says it was cut (chat here; Messages,
whose SDK keeps the block it saw start, in `api_support.messages_whole_and_streamed`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import jsonschema
import pytest
import torch
from api_support import messages_whole_and_streamed, sdk_client

from api.app import create_app
from api.config import ServerConfig
from api.generation.ending import decide_finish_reason
from engine.async_engine import AsyncEngine
from tests.conftest import save_tiny_model
from tests.engine.tiny_engine import make_smollm2_vocab_engine

pytestmark = pytest.mark.anyio

PARSERS = ["hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder"]
SET_MODE = {"name": "set_mode", "description": "Set the mode.", "parameters": {
    "type": "object", "required": ["mode"], "additionalProperties": False,
    "properties": {"mode": {"type": "string", "enum": ["fast", "slow"]}}}}
WRITE_NOTE = {"name": "write_note", "description": "Write a note.", "parameters": {
    "type": "object", "required": ["text"], "additionalProperties": False,
    "properties": {"text": {"type": "string"}}}}
SCHEMAS = {t["name"]: t["parameters"] for t in (SET_MODE, WRITE_NOTE)}
PROMPT = "Please do it."
ANTHROPIC_STOP = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}

PROBE_TOKENS = 64
"""The budget of the probe: the forced call as the model writes it when nothing cuts it (most
formats finish the call well within it; a model that rambles is cut by it)."""
ENDINGS = ["grammar end + EOS", "stop string inside the call", "stop_token_ids inside the call",
           "max_tokens, call closed", "max_tokens, call cut", "max_tokens inside the forced prefix"]


@pytest.mark.parametrize(("engine_reason", "made_calls", "left_open", "expected"), [
    ("stop", True, False, "tool_calls"), ("length", True, False, "tool_calls"),
    ("stop", False, False, "stop"), ("length", False, False, "length"),
    ("stop", True, True, "stop"), ("length", True, True, "length"),
    ("stop", False, True, "stop"), ("length", False, True, "length")])
def test_decision_table(engine_reason: str, made_calls: bool, left_open: bool, expected: str) -> None:
    """The module table of api/generation/ending.py, row by row."""
    assert decide_finish_reason(engine_reason, made_calls, left_open) == expected


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def engine(tmp_path_factory, smollm2_tokenizer) -> Iterator[AsyncEngine]:
    folder = tmp_path_factory.mktemp("endings") / "LlamaForCausalLM"
    save_tiny_model(folder, "LlamaForCausalLM", vocab_size=49152, max_position_embeddings=512)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    llm = make_smollm2_vocab_engine(folder, smollm2_tokenizer, max_model_len=512, num_blocks=160)
    engine = AsyncEngine(llm, "tiny", str(folder))
    yield engine
    engine.shutdown()
    llm.structured.close()
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def probes() -> dict[Any, Any]:
    """The probes of `_case`, shared by the module's tests."""
    return {}


@pytest.fixture(scope="module")
async def apps(engine: AsyncEngine) -> AsyncIterator[dict[tuple[str, bool], Any]]:
    """(parser, close_tool_calls) -> an app over the shared engine."""
    made = {(parser, close): create_app(engine, ServerConfig(sse_ping_interval_s=0, served_model_names=("tiny",),
                                                             tool_call_parser=parser, close_tool_calls=close))
            for parser in PARSERS for close in (True, False)}
    yield made
    for app in made.values():
        app.state.responses.store.close()


def _check_call(name: str, arguments: Any) -> None:
    jsonschema.validate(json.loads(arguments) if isinstance(arguments, str) else arguments, SCHEMAS[name])


async def _chat(app: Any, tool: dict[str, Any], fields: dict[str, Any]) -> tuple[str, list[Any], str, int]:
    """Chat whole and streamed (n=2): (content, [(name, arguments)], finish_reason, completion
    tokens of one choice), checked equal across the two choices and the two paths."""
    body = dict(model="tiny", messages=[{"role": "user", "content": PROMPT}], temperature=0, n=2,
                tools=[{"type": "function", "function": tool}], tool_choice="required", parallel_tool_calls=False,
                **fields)
    async with sdk_client(app) as client:
        whole = await client.chat.completions.create(**body)
        chunks = [c async for c in await client.chat.completions.create(**body, stream=True)]
    results = []
    for choice in whole.choices:
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        results.append((choice.message.content or "", calls, choice.finish_reason))
    for index in range(2):
        content, calls, reasons = "", {}, []
        for chunk in chunks:
            for choice in chunk.choices:
                if choice.index != index:
                    continue
                content += choice.delta.content or ""
                for delta in choice.delta.tool_calls or []:
                    entry = calls.setdefault(delta.index, [delta.function.name, ""])
                    entry[1] += delta.function.arguments or ""
                if choice.finish_reason is not None:
                    reasons.append(choice.finish_reason)
        assert len(reasons) == 1
        streamed = [tuple(c) for c in calls.values()]
        if reasons[0] == "length" and len(streamed) == len(results[index][1]) + 1:
            # a call the cut dropped: its header and fragments streamed, the whole answer leaves it out
            name, arguments = streamed.pop()
            assert name == tool["name"]
            with pytest.raises(json.JSONDecodeError):
                json.loads(arguments)
        assert (content, streamed, reasons[0]) == results[index]
    assert results[0] == results[1]
    return (*results[0], whole.usage.completion_tokens // 2)


async def _responses(app: Any, tool: dict[str, Any], fields: dict[str, Any]) -> tuple[list[Any], str]:
    """Responses whole and streamed: ([(name, arguments)], status), checked equal."""
    body: dict[str, Any] = dict(model="tiny", input=PROMPT, temperature=0, tool_choice="required",
                                parallel_tool_calls=False,
                                tools=[{"type": "function", **tool}], max_output_tokens=fields["max_tokens"])
    async with sdk_client(app) as client:
        whole = await client.responses.create(**body)
        events = [e async for e in await client.responses.create(**body, stream=True)]
    final = events[-1].response
    got = []
    for response in (whole, final):
        assert not any(item.type == "message" and item.content and item.content[0].text for item in response.output)
        got.append(([(i.name, i.arguments) for i in response.output if i.type == "function_call"], response.status))
    assert got[0] == got[1]
    return got[0]


async def _messages(app: Any, tool: dict[str, Any], fields: dict[str, Any]) -> tuple[str, list[Any], str]:
    """Messages whole and streamed (the SDK's final message): (text, [(name, input)], stop_reason)."""
    body: dict[str, Any] = dict(model="tiny", messages=[{"role": "user", "content": PROMPT}],
                                extra_body={"temperature": 0}, max_tokens=fields["max_tokens"],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                tools=[{"name": tool["name"], "description": tool["description"],
                                        "input_schema": tool["parameters"]}])
    if "stop" in fields:
        body["stop_sequences"] = fields["stop"]
    text, uses, stop_reason, _ = await messages_whole_and_streamed(app, body)
    return text, uses, stop_reason


async def _case(
    app_for: Any, tool: dict[str, Any], ending: str, tokenizer: Any, probes: dict[Any, Any]
) -> tuple[Any, dict[str, Any], str, tuple[Any, ...]]:
    """(app, request fields, expected finish_reason, the probe) of one ending; the probe is the
    chat answer with nothing cutting the call but PROBE_TOKENS (kept in `probes` per app and tool)."""
    key = (id(app_for(False)), tool["name"])
    if key not in probes:
        probes[key] = await _chat(app_for(False), tool, {"max_tokens": PROBE_TOKENS})
    probe = probes[key]
    _, _, probe_reason, probe_tokens = probe
    completes = probe_reason == "tool_calls"
    cut_at = probe_tokens - 1 if completes else 40
    if ending == "grammar end + EOS":
        return app_for(False), {"max_tokens": PROBE_TOKENS}, probe_reason, probe
    if ending == "stop string inside the call":
        return app_for(False), {"max_tokens": PROBE_TOKENS, "stop": [tool["name"], "mode", "text"]}, probe_reason, probe
    if ending == "stop_token_ids inside the call":
        ids = sorted({i for piece in (tool["name"], '"', "=", ">", "{", "}", "mode", "text", "_")
                      for i in tokenizer.encode(piece, add_special_tokens=False)})
        return app_for(False), {"max_tokens": PROBE_TOKENS, "extra_body": {"stop_token_ids": ids}}, probe_reason, probe
    if ending == "max_tokens, call closed":
        return app_for(True), {"max_tokens": cut_at}, "tool_calls", probe
    if ending == "max_tokens, call cut":
        return app_for(False), {"max_tokens": cut_at}, "length", probe
    return app_for(True), {"max_tokens": 3}, "length", probe


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("ending", ENDINGS)
async def test_ending_in_a_forced_call(apps, probes, smollm2_tokenizer, parser: str, ending: str) -> None:
    tool = WRITE_NOTE if ending.startswith("max_tokens,") else SET_MODE
    app, fields, expected, probe = await _case(lambda close: apps[parser, close], tool, ending, smollm2_tokenizer,
                                               probes)
    content, calls, finish_reason, _ = await _chat(app, tool, fields)
    if "stop" in ending:   # not matched inside the call: the very same answer
        assert (content, calls, finish_reason) == probe[:3]
    assert content == "", "a forced call never leaves markup as content"
    assert len(calls) == (1 if finish_reason == "tool_calls" else 0)
    if expected == "length" and calls:   # a call already whole at the cut is the answer
        expected = "tool_calls"
    assert finish_reason == expected
    for name, arguments in calls:
        assert name == tool["name"]
        _check_call(name, arguments)
    if "extra_body" in fields:   # stop_token_ids: a chat / completions extra only
        return
    response_calls, status = await _responses(app, tool, fields)
    assert status == ("incomplete" if finish_reason == "length" else "completed")
    assert [(name, json.loads(arguments)) for name, arguments in response_calls] == [
        (name, json.loads(arguments)) for name, arguments in calls]
    text, uses, stop_reason = await _messages(app, tool, fields)
    assert text == "" and stop_reason == ANTHROPIC_STOP[finish_reason]
    assert uses == [(name, json.loads(arguments)) for name, arguments in calls]

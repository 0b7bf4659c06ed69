"""tools + tool_choice (+ response_format) -> the grammar the engine receives, the prompt's tools and
template, and the 400s (unknown named tool, conflicts, malformed tool schemas)."""

from __future__ import annotations

import dataclasses

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, chat_body

from api.app import create_app
from api.config import ServerConfig
from api.generation.constraints import request_constraints
from api.generation.inputs import FunctionTool, GenerationInputs, Message, ToolInputs
from constrained.spec import GrammarKind, GrammarSpec
from engine import SamplingParams
from toolparsers import ToolSpec, get_tool_parser

pytestmark = pytest.mark.anyio

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather", "parameters": CITY},
}
TIME = {"type": "function", "function": {"name": "get_time", "strict": True}}  # no parameters
TOOLS = [WEATHER, TIME]
SPECS = [
    ToolSpec("get_weather", "Weather", CITY),
    ToolSpec("get_time", strict=True),
]
NAMED = {"type": "function", "function": {"name": "get_time"}}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=8192)  # the byte-level fake needs room for tool prompts


@asynccontextmanager
async def serve(engine: FakeEngine, **config: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine, ServerConfig(sse_ping_interval_s=0, **config))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
        yield c


async def sent(client: httpx.AsyncClient, engine: FakeEngine, **fields: Any) -> Any:
    response = await client.post("/v1/chat/completions", json=chat_body(**fields))
    assert response.status_code == 200, response.text
    return engine.requests[-1]


def closed(spec: GrammarSpec | None) -> GrammarSpec | None:
    """A tool grammar as the server sends it: argument objects closed (additional_properties False)."""
    return None if spec is None else dataclasses.replace(spec, additional_properties=False)


def hermes(tool_choice: Any, parallel: bool = True, specs: list[ToolSpec] = SPECS) -> GrammarSpec | None:
    return closed(get_tool_parser("hermes")().grammar_for(specs, tool_choice, parallel))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"tools": TOOLS}, hermes("auto")),
        ({"tools": TOOLS, "tool_choice": "auto"}, hermes("auto")),
        ({"tools": TOOLS, "tool_choice": "required"}, hermes("required")),
        (
            {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
            hermes("required", False),
        ),
        ({"tools": TOOLS, "tool_choice": "auto", "parallel_tool_calls": False}, hermes("auto", False)),
        ({"tools": TOOLS, "tool_choice": NAMED}, hermes(NAMED)),
        ({"tools": TOOLS, "tool_choice": "none"}, None),
        ({"tool_choice": "auto"}, None),
        (
            {"tools": TOOLS, "tool_choice": "none", "response_format": {"type": "json_object"}},
            GrammarSpec(GrammarKind.JSON_OBJECT, ""),
        ),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "text"}},
            hermes("required"),
        ),
    ],
)
async def test_tool_choice_grammar(
    client: httpx.AsyncClient, engine: FakeEngine, fields: dict[str, Any], expected: GrammarSpec | None
) -> None:
    request = await sent(client, engine, **fields)
    assert request.grammar_spec == expected
    assert request.sampling_params.skip_special_tokens is True


async def test_forced_grammars_force_and_limit_calls(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    required = json.loads(
        (await sent(client, engine, tools=TOOLS, tool_choice="required")).grammar_spec.source
    )
    assert required["forced"] is True and required["stop_after_first"] is False
    assert [s["begin"] for s in required["structures"]] == [
        '<tool_call>\n{"name": "get_weather", "arguments": ',
        '<tool_call>\n{"name": "get_time", "arguments": ',
    ]
    assert required["structures"][1]["schema"] == {"type": "object", "properties": {}, "additionalProperties": False}
    named = json.loads((await sent(client, engine, tools=TOOLS, tool_choice=NAMED)).grammar_spec.source)
    assert named["forced"] and named["stop_after_first"] and len(named["structures"]) == 1
    auto = json.loads((await sent(client, engine, tools=TOOLS)).grammar_spec.source)
    assert auto["forced"] is False and auto["triggers"] == ["<tool_call>"]


async def test_tools_rendered_unless_tool_choice_none(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    for choice, rendered in (("auto", True), ("required", True), (NAMED, True), ("none", False)):
        request = await sent(client, engine, tools=TOOLS, tool_choice=choice)
        prompt = engine.tokenizer.decode(request.prompt_token_ids)
        assert ("get_weather" in prompt) is rendered, choice


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            None,
        ),
        ({"tool_choice": NAMED}, "tool_choice", None),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.function", None),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": JSON_FORMAT},
            "response_format",
            None,
        ),
        (
            {"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_object"}},
            "response_format",
            None,
        ),
        (
            {"tools": TOOLS, "tool_choice": "required", "structured_outputs": {"regex": "a"}},
            "structured_outputs",
            None,
        ),
        ({"tools": TOOLS, "structured_outputs": {"regex": "a"}}, "structured_outputs", None),
        ({"tools": TOOLS, "structured_outputs": {"choice": ["a"]}}, "structured_outputs", None),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
            "tools[0].function.parameters",
            None,
        ),
        (
            {
                "tools": [
                    WEATHER,
                    {"type": "function", "function": {"name": "f", "parameters": {"required": 1}}},
                ]
            },
            "tools[1].function.parameters",
            None,
        ),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name", None),
        ({"tools": [{"type": "function"}]}, "tools[0].function", None),
    ],
)
async def test_tool_errors(
    client: httpx.AsyncClient, engine: FakeEngine, fields: dict[str, Any], param: str, code: str | None
) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body(**fields))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == code and error["type"] == "invalid_request_error"
    assert engine.requests == []


async def test_schema_verdicts_cached_by_text_keep_each_requests_param(client: httpx.AsyncClient) -> None:
    """The meta-schema check is cached by the schema's canonical text: the same bad schema sent
    again, in another place, names that place; the same schema with keys in another order is the
    same verdict; a valid schema cached before stays valid."""
    bad = {"type": "object", "properties": {"a": {"type": "nope"}}}
    reordered = {"properties": {"a": {"type": "nope"}}, "type": "object"}
    for tools, param in (
        ([{"type": "function", "function": {"name": "f", "parameters": bad}}], "tools[0].function.parameters"),
        ([WEATHER, {"type": "function", "function": {"name": "f", "parameters": reordered}}],
         "tools[1].function.parameters"),
    ):
        response = await client.post("/v1/chat/completions", json=chat_body(tools=tools))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and "properties.a.type" in error["message"], error
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": bad}}
    response = await client.post("/v1/chat/completions", json=chat_body(response_format=fmt))
    assert response.status_code == 400 and response.json()["error"]["param"] == "response_format.json_schema.schema"
    for _ in range(2):
        response = await client.post("/v1/chat/completions", json=chat_body(tools=TOOLS))
        assert response.status_code == 200, response.text


async def test_unknown_named_tool_message_lists_tools(client: httpx.AsyncClient) -> None:
    choice = {"type": "function", "function": {"name": "nope"}}
    response = await client.post("/v1/chat/completions", json=chat_body(tools=TOOLS, tool_choice=choice))
    assert (
        "nope" in response.json()["error"]["message"] and "get_weather" in response.json()["error"]["message"]
    )


HERMES_TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
HERMES_WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


@pytest.mark.parametrize("backend", ["guidance", "xgrammar"])
async def test_auto_with_json_format_allows_answer_or_calls(
    client: httpx.AsyncClient, engine: FakeEngine, grammar_accepts, backend: str
) -> None:
    """The grammar the engine gets, compiled on each backend: the JSON answer or the calls, nothing else."""
    spec = (await sent(client, engine, tools=TOOLS, response_format=JSON_FORMAT)).grammar_spec
    assert spec.backend is None  # the server's default order picks the backend
    for text in ('{"answer": "sunny"}', HERMES_TIME, HERMES_WEATHER, HERMES_TIME + "\n" + HERMES_WEATHER):
        assert grammar_accepts(spec, text, backend), text
    for text in ("It is sunny.", '{"answer": 1}', "Let me check. " + HERMES_TIME, '{"answer": "sunny"}' + HERMES_TIME,
                 HERMES_WEATHER.replace('"Oslo"', '"Oslo", "extra": 1')):   # arguments stay closed
        assert not grammar_accepts(spec, text, backend), text
    one = (
        await sent(
            client,
            engine,
            tools=TOOLS,
            parallel_tool_calls=False,
            structured_outputs={"json_object": True, "disable_any_whitespace": True},
        )
    ).grammar_spec
    assert grammar_accepts(one, '{"any":["json"]}', backend) and grammar_accepts(one, HERMES_TIME, backend)
    assert not grammar_accepts(one, '{"any": ["json"]}', backend)   # disable_any_whitespace
    assert not grammar_accepts(one, HERMES_TIME + "\n" + HERMES_TIME, backend)   # one call only


async def test_auto_with_json_format_takes_the_requested_backend(client: httpx.AsyncClient, engine: FakeEngine,
                                                                 grammar_accepts) -> None:
    fields = {"tools": TOOLS, "response_format": JSON_FORMAT, "structured_outputs": {"backend": "xgrammar"}}
    spec = (await sent(client, engine, **fields)).grammar_spec
    assert spec.backend == "xgrammar"
    assert grammar_accepts(spec, HERMES_TIME, "xgrammar") and not grammar_accepts(spec, "It is sunny.", "xgrammar")


async def test_auto_with_json_format_in_a_format_without_json_tags_is_refused(engine: FakeEngine) -> None:
    async with serve(engine, tool_call_parser="pythonic") as client:
        response = await client.post(
            "/v1/chat/completions", json=chat_body(tools=TOOLS, response_format=JSON_FORMAT)
        )
    assert response.status_code == 400 and response.json()["error"]["param"] == "response_format"
    assert response.json()["error"]["code"] == "not_supported"


async def test_server_flags(engine: FakeEngine) -> None:
    async with serve(engine, constrain_auto_tools=False) as client:
        assert (await sent(client, engine, tools=TOOLS)).grammar_spec is None
        assert (await sent(client, engine, tools=TOOLS, response_format=JSON_FORMAT)).grammar_spec.kind == (
            GrammarKind.JSON_SCHEMA
        )
        assert (await sent(client, engine, tools=TOOLS, tool_choice="required")).grammar_spec == hermes(
            "required"
        )
        engine.script = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
        response = await client.post("/v1/chat/completions", json=chat_body(tools=TOOLS))
        assert response.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"
    async with serve(engine, enable_auto_tool_choice=False) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(tools=TOOLS))
        assert response.status_code == 400 and response.json()["error"]["param"] == "tool_choice"
        assert (await sent(client, engine, tools=TOOLS, tool_choice=NAMED)).grammar_spec == hermes(NAMED)
        assert (await sent(client, engine, tools=TOOLS, tool_choice="none")).grammar_spec is None


async def test_close_grammar_flags(engine: FakeEngine) -> None:
    """Tool calls are closed before max_tokens by default, formats only with --close-structured-outputs;
    completions follow the format flag; a request without a grammar never closes."""
    async def closes(client, **fields) -> bool:
        return (await sent(client, engine, **fields)).close_grammar

    async with serve(engine) as client:
        assert await closes(client, tools=TOOLS, tool_choice="required")
        assert await closes(client, tools=TOOLS, tool_choice=NAMED)
        assert await closes(client, tools=TOOLS)
        assert not await closes(client, response_format=JSON_FORMAT)
        assert not await closes(client, tools=TOOLS, response_format=JSON_FORMAT)
        assert not await closes(client)
        await client.post("/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 2,
                                                   "response_format": JSON_FORMAT})
        assert engine.requests[-1].close_grammar is False
    async with serve(engine, close_tool_calls=False, close_structured_outputs=True) as client:
        assert not await closes(client, tools=TOOLS, tool_choice="required")
        assert not await closes(client, tools=TOOLS)
        assert await closes(client, response_format=JSON_FORMAT)
        assert not await closes(client, tools=TOOLS, response_format=JSON_FORMAT)
        assert await closes(client, tools=TOOLS, tool_choice="none", response_format=JSON_FORMAT)
        assert not await closes(client, tools=TOOLS, tool_choice="none")
        await client.post("/v1/completions", json={"model": "fake-model", "prompt": "x", "max_tokens": 2,
                                                   "response_format": JSON_FORMAT})
        assert engine.requests[-1].close_grammar is True


async def test_mistral_keeps_special_tokens(engine: FakeEngine) -> None:
    async with serve(engine, tool_call_parser="mistral") as client:
        request = await sent(client, engine, tools=TOOLS, tool_choice="required")
        assert request.sampling_params.skip_special_tokens is False
        assert request.grammar_spec == closed(get_tool_parser("mistral")().grammar_for(SPECS, "required", True))
        assert (
            await sent(client, engine, tools=TOOLS, tool_choice="none")
        ).sampling_params.skip_special_tokens


async def test_structured_outputs_options_apply_to_tool_grammar(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    fields = {"tools": TOOLS, "tool_choice": "required", "structured_outputs": {"backend": "guidance"}}
    assert (await sent(client, engine, **fields)).grammar_spec.backend == "guidance"


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


async def test_template_selection(engine: FakeEngine) -> None:
    engine.tokenizer.chat_template = (  # like SmolLM2's: never reads `tools`
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    async with serve(engine) as client:
        with_tools = engine.tokenizer.decode((await sent(client, engine, tools=TOOLS)).prompt_token_ids)
        assert "<tools>\n" in with_tools and '"name": "get_weather"' in with_tools
        assert "<tool_call></tool_call>" in with_tools
        plain = engine.tokenizer.decode((await sent(client, engine)).prompt_token_ids)
        assert plain == "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"
        # tool history needs the tool template even when no tools are offered any more
        history = engine.tokenizer.decode(
            (await sent(client, engine, messages=HISTORY, tools=TOOLS, tool_choice="none")).prompt_token_ids
        )
        assert "<tools>" not in history
        assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in history
        assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>" in history
    async with serve(engine, chat_template="[{{ messages | length }}{{ tools | length }}]") as client:
        assert engine.tokenizer.decode((await sent(client, engine, tools=TOOLS)).prompt_token_ids) == "[12]"
    async with serve(engine, tool_call_parser="pythonic") as client:  # no shipped template: the model's own
        assert "<tools>" not in engine.tokenizer.decode(
            (await sent(client, engine, tools=TOOLS)).prompt_token_ids
        )


async def test_tool_aware_model_template_is_kept(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    prompt = engine.tokenizer.decode((await sent(client, engine, tools=TOOLS)).prompt_token_ids)
    assert "<|im_start|>tools\n" in prompt and "<tools>" not in prompt  # FakeTokenizer's template reads tools


@pytest.mark.parametrize(("tool_choice", "constrain_auto", "expected"), [
    ("required", True, True), (NAMED, False, True), ("auto", True, True), ("auto", False, False),
])
def test_the_parser_reads_names_early_only_where_the_grammar_constrains_calls(tool_choice, constrain_auto,
                                                                              expected) -> None:
    """`ToolCalling.constrained` (the header goes out once a name closes) follows the grammar: forced
    calls and constrained "auto" calls, never parse-only mode (--no-constrain-auto-tools)."""
    tools = tuple(FunctionTool(t["function"]["name"], f"tools[{i}].function.parameters",
                               parameters=t["function"].get("parameters")) for i, t in enumerate(TOOLS))
    inputs = GenerationInputs((Message("user", "hi"),), SamplingParams(), ToolInputs(tools, tool_choice))
    calling = request_constraints(inputs, ServerConfig(constrain_auto_tools=constrain_auto)).tool_calling
    assert calling is not None and calling.constrained is expected
    assert calling.new_parser().constrained is expected

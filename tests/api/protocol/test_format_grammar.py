"""response_format / structured_outputs -> the GrammarSpec the engine receives, and the 400s for
conflicts, malformed schemas and grammars a backend cannot compile (cases 008, 009, 011, 012, 014)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from api_support import FakeEngine, chat_body, sse_json

from constrained.errors import GrammarCompileTimeout, InvalidGrammar
from constrained.spec import GrammarKind, GrammarSpec

pytestmark = pytest.mark.anyio

COMPLETION = {"model": "fake-model", "prompt": "test"}
PATHS = ["/v1/chat/completions", "/v1/completions"]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
# key order kept: the order of properties is the order the model writes them in
SCHEMA_TEXT = (
    '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},'
    '"required":["name","age"],"additionalProperties":false}'
)


def body(path: str, **fields: Any) -> dict[str, Any]:
    return chat_body(**fields) if "chat" in path else {**COMPLETION, **fields}


async def spec_of(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, **fields: Any
) -> GrammarSpec | None:
    response = await client.post(path, json=body(path, **fields))
    assert response.status_code == 200, response.text
    return engine.requests[-1].grammar_spec


GOOD = [
    # (fields, expected spec)
    ({}, None),
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, GrammarSpec(GrammarKind.JSON_OBJECT, "")),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": SCHEMA, "strict": True},
            }
        },
        GrammarSpec(GrammarKind.JSON_SCHEMA, SCHEMA_TEXT),
    ),
    ({"structured_outputs": {"json": SCHEMA}}, GrammarSpec(GrammarKind.JSON_SCHEMA, SCHEMA_TEXT)),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, GrammarSpec(GrammarKind.JSON_SCHEMA, SCHEMA_TEXT)),
    ({"structured_outputs": {"regex": "[a-z]+\\d"}}, GrammarSpec(GrammarKind.REGEX, "[a-z]+\\d")),
    (
        {"structured_outputs": {"choice": ["yes", "no", "é"]}},
        GrammarSpec(GrammarKind.CHOICE, '["yes", "no", "é"]'),
    ),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, GrammarSpec(GrammarKind.GRAMMAR, 'root ::= "a"')),
    ({"structured_outputs": {"json_object": True}}, GrammarSpec(GrammarKind.JSON_OBJECT, "")),
    (
        {"structured_outputs": {"structural_tag": {"structures": [], "triggers": ["<f"]}}},
        GrammarSpec(GrammarKind.STRUCTURAL_TAG, '{"structures":[],"triggers":["<f"]}'),
    ),
    (
        {"structured_outputs": {"structural_tag": '{"triggers": ["<f"], "structures": []}'}},
        GrammarSpec(GrammarKind.STRUCTURAL_TAG, '{"triggers":["<f"],"structures":[]}'),
    ),
    (
        {
            "structured_outputs": {
                "regex": "a+",
                "backend": "guidance",
                "disable_any_whitespace": True,
                "disable_additional_properties": True,
            }
        },
        GrammarSpec(GrammarKind.REGEX, "a+", "guidance", any_whitespace=False, additional_properties=False),
    ),
    ({"structured_outputs": {"regex": "a+", "backend": "auto"}}, GrammarSpec(GrammarKind.REGEX, "a+")),
    # options-only structured_outputs apply to the response_format's constraint (as in vLLM)
    (
        {
            "response_format": {"type": "json_object"},
            "structured_outputs": {"backend": "xgrammar", "disable_any_whitespace": True},
        },
        GrammarSpec(GrammarKind.JSON_OBJECT, "", "xgrammar", any_whitespace=False),
    ),
    # text imposes nothing, so it does not conflict
    (
        {"response_format": {"type": "text"}, "structured_outputs": {"choice": ["a"]}},
        GrammarSpec(GrammarKind.CHOICE, '["a"]'),
    ),
    ({"structured_outputs": {"backend": "guidance"}}, None),
    ({"structured_outputs": {"json_object": False}}, None),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("fields", "expected"), GOOD, ids=[str(i) for i in range(len(GOOD))])
async def test_format_becomes_grammar_spec(
    client: httpx.AsyncClient,
    engine: FakeEngine,
    path: str,
    fields: dict[str, Any],
    expected: GrammarSpec | None,
) -> None:
    assert await spec_of(client, engine, path, **fields) == expected


BAD = [
    # (fields, param): each one a 400 before anything is generated
    (
        {"response_format": {"type": "json_schema", "schema": {"type": "object"}}},
        "response_format.json_schema",
    ),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}},
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "notatype"}}}},
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/missing"}}}},
        "response_format.json_schema.schema",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": {"properties": {"a": {"minLength": -1}}}},
            }
        },
        "response_format.json_schema.schema",
    ),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"json": "[1, 2]"}}, "structured_outputs.json"),
    ({"structured_outputs": {"json": 5}}, "structured_outputs.json"),
    ({"structured_outputs": {"json": {"type": 5}}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": ""}}, "structured_outputs.regex"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a", 1]}}, "structured_outputs.choice[1]"),
    ({"structured_outputs": {"structural_tag": "[]"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "backend": "outlines"}}, "structured_outputs.backend"),
    ({"structured_outputs": {"backend": "outlines"}}, "structured_outputs.backend"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern"),
    ({"structured_outputs": "regex"}, "structured_outputs"),
    (
        {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
        "structured_outputs.regex",
    ),
    (
        {
            "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}},
            "structured_outputs": {"json": SCHEMA},
        },
        "structured_outputs.json",
    ),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("fields", "param"), BAD, ids=[str(i) for i in range(len(BAD))])
async def test_bad_formats_are_400_naming_the_field(
    client: httpx.AsyncClient, engine: FakeEngine, path: str, stream: bool, fields: dict[str, Any], param: str
) -> None:
    response = await client.post(path, json=body(path, stream=stream, **fields))
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param, error
    assert engine.requests == []
    assert (await client.post(path, json=body(path))).status_code == 200


async def test_missing_schema_message_names_json_schema(client: httpx.AsyncClient) -> None:
    fields = {"response_format": {"type": "json_schema", "schema": {"type": "object"}}}
    response = await client.post("/v1/chat/completions", json=chat_body(**fields))
    assert response.status_code == 400 and "json_schema" in response.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "g", "schema": SCHEMA}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"regex": "(a"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs.grammar"),
    ],
)
async def test_backend_compile_failure_is_400_naming_the_field(
    client: httpx.AsyncClient, engine: FakeEngine, stream: bool, fields: dict[str, Any], param: str
) -> None:
    # case 009: the engine's compile fails -> 400 before any token, the HTTP status even when streaming
    engine.grammar_error = InvalidGrammar(
        "xgrammar cannot compile json_schema: bad pattern '^(hello|hi'", "json_schema"
    )
    response = await client.post("/v1/chat/completions", json=chat_body(stream=stream, **fields))
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error == {
        "message": "xgrammar cannot compile json_schema: bad pattern '^(hello|hi'",
        "type": "invalid_request_error",
        "param": param,
        "code": "invalid_grammar",
    }
    assert engine.completed == []
    assert engine.grammar_error.param == "json_schema"  # the field is named by a new error, not patched in
    engine.grammar_error = None
    assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200


async def test_compile_timeout_is_400(client: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.grammar_error = GrammarCompileTimeout("compiling took longer than 10 s", "json_schema")
    response = await client.post("/v1/completions", json={**COMPLETION, "structured_outputs": {"regex": "a"}})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "grammar_compile_timeout"
    assert response.json()["error"]["param"] == "structured_outputs.regex"


@pytest.mark.parametrize("stream", [False, True])
async def test_length_cut_inside_json_is_reported(
    client: httpx.AsyncClient, engine: FakeEngine, stream: bool
) -> None:
    # case 014: the truncated document comes back as is, with finish_reason "length"
    engine.script = '{"age": 31, "description": "tall"}'
    fields = {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
    response = await client.post(
        "/v1/chat/completions", json=chat_body(max_tokens=6, stream=stream, **fields)
    )
    assert response.status_code == 200
    if stream:
        chunks = sse_json(response.text)
        content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        reasons = [
            c["choices"][0]["finish_reason"]
            for c in chunks
            if c["choices"] and c["choices"][0]["finish_reason"]
        ]
    else:
        choice = response.json()["choices"][0]
        content, reasons = choice["message"]["content"], [choice["finish_reason"]]
    assert content == '{"age"' and reasons == ["length"]


async def test_json_answer_is_not_parsed_for_tools_when_tool_choice_none(
    client: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script = '{"a": "<tool_call>"}'
    fields = {
        "response_format": {"type": "json_object"},
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": "none",
    }
    response = await client.post("/v1/chat/completions", json=chat_body(**fields))
    message = response.json()["choices"][0]["message"]
    assert message["content"] == '{"a": "<tool_call>"}' and "tool_calls" not in message
    assert engine.requests[0].grammar_spec == GrammarSpec(GrammarKind.JSON_OBJECT, "")

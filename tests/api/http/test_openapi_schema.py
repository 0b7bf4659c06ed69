"""/openapi.json: every body-reading route documents its body; errors are OpenAI error objects
(Anthropic's on /v1/messages*)."""

from __future__ import annotations

import httpx
import jsonschema
import pytest

from api.http.openapi import REQUEST_BODIES

pytestmark = pytest.mark.anyio

_NO_BODY = {("post", "/v1/responses/{response_id}/cancel")}


async def test_request_bodies_are_documented(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    posts = {("post", path) for path, operations in document["paths"].items() if "post" in operations}
    assert posts - _NO_BODY == set(REQUEST_BODIES), "a new POST route needs its body in REQUEST_BODIES"
    schemas = document["components"]["schemas"]
    for (method, path), model in REQUEST_BODIES.items():
        body = document["paths"][path][method]["requestBody"]
        ref = body["content"]["application/json"]["schema"]["$ref"]
        assert body["required"] and ref == f"#/components/schemas/{model.__name__}"
        assert set(schemas[model.__name__]["properties"]) == set(model.model_fields)
    chat = schemas["ChatCompletionRequest"]
    assert chat["additionalProperties"] is False and chat["required"] == ["messages"]


async def test_errors_are_documented_as_openai_objects(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            assert "422" not in responses, f"{method} {path}: validation errors are 400s"
            error = responses["default"]["content"]["application/json"]["schema"]
            shape = "AnthropicError" if path.startswith("/v1/messages") else "ErrorResponse"
            assert error == {"$ref": f"#/components/schemas/{shape}"}, f"{method} {path}"
    error_info = document["components"]["schemas"]["ErrorInfo"]
    assert set(error_info["properties"]) == {"message", "type", "param", "code"}
    assert "content" not in document["paths"]["/health"]["get"]["responses"]["200"]   # empty body


# Bodies this server serves, one per member of each tagged union with a catch-all branch (the
# Unsupported* models that refuse other types): each must match exactly one branch of the union's
# `oneOf` in the published document, or a schema-driven client (or fuzzer) reads it as invalid.
_SERVED_BODIES = {
    "ResponsesRequest": [
        {"input": [{"type": "function_call", "call_id": "0", "name": "f", "arguments": "", "id": ""},
                   {"type": "function_call_output", "call_id": "0", "output": "ok"},
                   {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"},
                                                                        {"type": "refusal", "refusal": "no"}]},
                   {"role": "user", "content": [{"type": "input_text", "text": "b"}]}],
         "tools": [{"type": "function", "name": "f", "parameters": {}}],
         "tool_choice": {"type": "function", "name": "f"}},
    ],
    "MessagesRequest": [
        {"model": "m", "max_tokens": 4, "tools": [{"name": "a", "input_schema": {}},
                                                 {"type": "custom", "name": "b", "input_schema": {}}],
         "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "a", "input": {}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "y"}]}]},
    ],
}


async def test_served_union_members_match_one_branch(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    for model, bodies in _SERVED_BODIES.items():
        schema = {"$ref": f"#/components/schemas/{model}", "components": document["components"]}
        for body in bodies:
            jsonschema.validate(body, schema)
        refused = {**bodies[0], "tools": [{"type": "web_search"}]}   # the catch-all branch alone
        jsonschema.validate(refused, schema)
        wrong = {**bodies[0], "tools": [{"type": "function" if model == "ResponsesRequest" else "custom"}]}
        with pytest.raises(jsonschema.ValidationError):   # a served type missing its fields
            jsonschema.validate(wrong, schema)

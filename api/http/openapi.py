"""/openapi.json as the server really behaves: request bodies documented, errors as OpenAI objects.

The routes read their bodies themselves (`api/http/body.py`: strict, 400 naming the field), so
FastAPI sees no body parameter and would publish POST operations without a request body, and
would promise 422 validation bodies the server never sends. REQUEST_BODIES puts the bodies back;
every operation documents its non-2xx answers as the OpenAI error object (`api/http/errors.py`),
or as Anthropic's error object on /v1/messages*.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from api.chat.protocol import ChatCompletionRequest
from api.protocol.common import ErrorResponse
from api.completions.protocol import CompletionRequest
from api.admin.protocol import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from api.responses.protocol.request import ResponsesRequest
from api.messages.objects import AnthropicError
from api.messages.protocol import CountTokensRequest, MessagesRequest
from api.http.errors import is_anthropic_route
from api.admin.protocol import DetokenizeRequest, TokenizeRequest

REQUEST_BODIES: dict[tuple[str, str], type[BaseModel]] = {
    # (method, path) -> the model its route passes to `read_body`
    ("post", "/v1/chat/completions"): ChatCompletionRequest,
    ("post", "/v1/completions"): CompletionRequest,
    ("post", "/v1/responses"): ResponsesRequest,
    ("post", "/v1/messages"): MessagesRequest,
    ("post", "/v1/messages/count_tokens"): CountTokensRequest,
    ("post", "/tokenize"): TokenizeRequest,
    ("post", "/detokenize"): DetokenizeRequest,
    ("post", "/v1/load_lora_adapter"): LoadLoraAdapterRequest,
    ("post", "/v1/unload_lora_adapter"): UnloadLoraAdapterRequest,
}
_REF = "#/components/schemas/{model}"
_UNUSED = ("HTTPValidationError", "ValidationError")   # FastAPI's 422 bodies


def install_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` (served at /openapi.json) build the schema with `openapi_document`."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema of `app` with the REQUEST_BODIES added and 422 replaced by a default
    ErrorResponse on every operation."""
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    models: list[tuple[type[BaseModel], Any]] = [(m, "validation") for m in REQUEST_BODIES.values()]
    errors: list[tuple[type[BaseModel], Any]] = [(ErrorResponse, "serialization"), (AnthropicError, "serialization")]
    refs, defs = models_json_schema([*models, *errors], ref_template=_REF)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in _UNUSED:
        schemas.pop(name, None)
    new = defs.get("$defs", {})
    assert all(schemas.get(name, schema) == schema for name, schema in new.items()), "component name clash"
    schemas.update(new)
    error = {"description": "OpenAI error object",
             "content": {"application/json": {"schema": refs[(ErrorResponse, "serialization")]}}}
    anthropic_error = {"description": "Anthropic error object",
                       "content": {"application/json": {"schema": refs[(AnthropicError, "serialization")]}}}
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            model = REQUEST_BODIES.get((method, path))
            if model is not None:
                operation["requestBody"] = {
                    "required": True,
                    "content": {"application/json": {"schema": refs[(model, "validation")]}},
                }
            operation["responses"].pop("422", None)
            operation["responses"]["default"] = anthropic_error if is_anthropic_route(path) else error
    return document

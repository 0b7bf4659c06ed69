"""Reading a request body into its pydantic model, with every failure a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from api.errors import ClientDisconnected, InvalidRequest
from api.http.errors import invalid_request_from_errors

ModelT = TypeVar("ModelT", bound=BaseModel)


def parse_body(raw: bytes, model: type[ModelT]) -> ModelT:
    """Validate JSON bytes against `model` in strict mode (no "10" -> 10, no 1.0 -> 1).

    Raises InvalidRequest (or NotSupported) whose `param` is the path of the field at fault.
    """
    if not raw.strip():
        raise InvalidRequest("the request body is empty; expected a JSON object")
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as exc:
        raise invalid_request_from_errors(exc.errors(include_url=False), _loads_or_none(raw)) from None


async def read_body(request: Request, model: type[ModelT]) -> ModelT:
    """Read the whole body of `request` and validate it as `model` (see parse_body). Raises
    ClientDisconnected (499, logged as aborted) when the client leaves before the body is in."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise ClientDisconnected("the client disconnected before sending the whole body") from None
    return parse_body(raw, model)


def _loads_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None

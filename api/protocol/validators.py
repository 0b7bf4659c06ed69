"""Field types and checks several request bodies share: `stop`, and fields this server refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import Field, ValidationInfo
from pydantic_core import PydanticCustomError


def not_supported(field: str) -> PydanticCustomError:
    """The 400 (type not_supported) for a request field this server does not serve."""
    return PydanticCustomError("not_supported", "'{field}' is not supported by this server", {"field": field})


def reject_when_set(cls: type, value: Any, info: ValidationInfo) -> Any:
    """A field validator (`field_validator(*names)(reject_when_set)`): not_supported unless null."""
    if value is not None:
        raise not_supported(info.field_name or "")
    return value


Stop = str | list[str] | None
"""`stop`: one string or a list of strings (that none is empty is SamplingParams' check)."""


def reject_type(message: str) -> Callable[[type, str], str]:
    """A `type` field validator (`field_validator("type")(reject_type(...))`) that refuses every
    value: not_supported with `message`, in which `{t}` is the type sent."""

    def reject(cls: type, value: str) -> str:
        raise PydanticCustomError("not_supported", message, {"t": value})

    return reject


def other_type(*served: str) -> Any:
    """The `type` field of a tagged union's catch-all model (the one that refuses every type the
    union does not serve): required, and in the OpenAPI schema any string except `served`, so that
    a valid member matches exactly one branch of the union's `oneOf`."""
    return Field(json_schema_extra={"not": {"enum": list(served)}})


def type_of(value: Any) -> Any:
    """The `type` of a raw dict or a model, None when it has none: what the discriminators of
    tagged unions read."""
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)

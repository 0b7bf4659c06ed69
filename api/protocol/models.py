"""/v1/models response objects."""

from __future__ import annotations

from typing import Literal

from api.protocol.common import ResponseModel


class ModelCard(ResponseModel):
    """One served model; `root` is the model path, `parent` the base model of an adapter."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "structserve"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(ResponseModel):
    """`{"object": "list", "data": [...]}`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]

"""The id, creation time and model name shared by every chunk of one response."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    """`id` (also the engine request id), `created` (Unix seconds) and the reported `model`."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, prefix: str, model: str) -> ResponseMeta:
        """A fresh id such as `chatcmpl-<32 hex>`, created now."""
        return cls(id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()), model=model)

"""What every route needs: the engine (as a protocol), the server config, and the model lookup."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from fastapi import Depends, Request

from api.config import ServerConfig
from api.errors import ModelNotFound
from engine import EngineStats
from engine import EngineRequest, RequestOutput
from lora.registry import LoraAdapterInfo


class EngineClient(Protocol):
    """The part of `engine.async_engine.AsyncEngine` the api uses (a fake engine in tests)."""

    tokenizer: Any
    model_name: str
    model_path: str
    max_model_len: int

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Check the request against the model (raises here: LLMEngine.validate) and return its
        outputs; the stream raises before its first output when the engine refuses it later
        (overload, shutdown), and iterating it no further aborts the request."""
        ...

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        """Raise InvalidSamplingParams(param) for an id outside the model's vocabulary (/detokenize)."""
        ...

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op when it is unknown or finished)."""
        ...

    def abort_all(self) -> None:
        """Abort every submitted request; each ends with finish_reason "abort" (graceful shutdown)."""
        ...

    def check_admission(self) -> None:
        """Raise EngineDeadError / EngineOverloaded when a new request would be refused now."""
        ...

    def is_healthy(self) -> bool:
        """False once the engine thread is gone."""
        ...

    def stats(self) -> EngineStats:
        """Counters and gauges for /metrics."""
        ...


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """The model a request asked for: the name to report and the LoRA adapter (None: base model)."""

    name: str
    lora_name: str | None = None


@dataclass(frozen=True, slots=True)
class ServerContext:
    """Engine + config, shared by all routes through `app.state.context`."""

    engine: EngineClient
    config: ServerConfig
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """Names listed by /v1/models; the first is reported in responses."""
        return self.config.served_model_names or (self.engine.model_name,)

    def lora_adapters(self) -> list[LoraAdapterInfo]:
        """The engine's loaded LoRA adapters (an engine without `lora_adapters`, e.g. a test fake: none)."""
        list_adapters = getattr(self.engine, "lora_adapters", None)
        return list(list_adapters()) if list_adapters is not None else []

    def resolve_model(self, requested: str | None) -> ResolvedModel:
        """Map the request's `model` to a served model or a LoRA adapter; None means the base model.

        The one place that decides which names exist; base model names win over an adapter of the
        same name. Raises ModelNotFound listing the available names (base and adapters).
        """
        names = self.served_model_names
        if requested is None or requested in names or requested in self.config.model_aliases:
            return ResolvedModel(name=names[0])
        adapter_names = [adapter.name for adapter in self.lora_adapters()]
        if requested in adapter_names:
            return ResolvedModel(name=requested, lora_name=requested)
        raise ModelNotFound(
            f"The model `{requested}` does not exist. Available models: {', '.join([*names, *adapter_names])}",
            param="model",
        )


def get_context(request: Request) -> ServerContext:
    """FastAPI dependency: the app's ServerContext."""
    context: ServerContext = request.app.state.context
    return context


Context = Annotated[ServerContext, Depends(get_context)]
"""Route parameter type that receives the app's ServerContext."""

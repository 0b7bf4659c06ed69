"""Bodies of POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's shapes)."""

from __future__ import annotations

from pydantic import Field

from api.protocol.common import RequestModel


class LoadLoraAdapterRequest(RequestModel):
    """Load the PEFT adapter in folder `lora_path` (on the server) under `lora_name`;
    `load_inplace` replaces an adapter already loaded under that name."""

    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False


class UnloadLoraAdapterRequest(RequestModel):
    """Unload the adapter `lora_name` (`lora_int_id` is accepted for vLLM clients and ignored)."""

    lora_name: str = Field(min_length=1, max_length=256)
    lora_int_id: int | None = None

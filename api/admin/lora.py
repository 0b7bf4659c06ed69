"""POST /v1/load_lora_adapter and POST /v1/unload_lora_adapter (run-time LoRA management).

Both need `--allow-runtime-lora` (and the API key when one is set). Answers are vLLM's plain-text
success lines; failures are OpenAI error objects: 400 for a bad folder, a taken name or run-time
loading switched off, 404 for unloading an unknown name.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse

from api.http.auth import require_api_key
from api.http.context import Context, ServerContext
from api.errors import InvalidRequest
from api.admin.protocol import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from api.http.body import read_body
from lora.errors import LoraNotEnabled

router = APIRouter(dependencies=[Depends(require_api_key)])


def _runtime_engine(context: ServerContext) -> Any:
    """The engine, once run-time LoRA updates are allowed; raises LoraNotEnabled otherwise."""
    if not context.config.allow_runtime_lora:
        raise LoraNotEnabled("run-time LoRA loading is off; start the server with --allow-runtime-lora")
    engine = context.engine
    if not getattr(engine, "lora_enabled", False):
        raise LoraNotEnabled("LoRA is off; start the server with --enable-lora")
    return engine


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request, context: Context) -> PlainTextResponse:
    """Read and validate the adapter folder (off the event loop), then serve it as `lora_name`.
    Requests already running are not disturbed; the new name is usable as `model` at once."""
    body = await read_body(request, LoadLoraAdapterRequest)
    engine = _runtime_engine(context)
    if body.lora_name in context.served_model_names or body.lora_name in context.config.model_aliases:
        raise InvalidRequest(f"'{body.lora_name}' is the base model's name; choose another lora_name",
                             param="lora_name")
    await engine.load_lora_adapter(body.lora_name, body.lora_path, body.load_inplace)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request, context: Context) -> PlainTextResponse:
    """Stop serving `lora_name` at once (new requests naming it get 404) and answer once the
    requests already using it have finished on its weights; its memory is then freed."""
    body = await read_body(request, UnloadLoraAdapterRequest)
    await _runtime_engine(context).unload_lora_adapter(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

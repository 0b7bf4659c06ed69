"""GET /v1/models and GET /v1/models/{model}."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.http.auth import require_api_key
from api.http.context import Context, ServerContext
from api.errors import ModelNotFound
from api.admin.protocol import ModelCard, ModelList

router = APIRouter(dependencies=[Depends(require_api_key)])


def _cards(context: ServerContext) -> list[ModelCard]:
    engine = context.engine
    names = context.served_model_names
    cards = [
        ModelCard(
            id=name, created=context.created, root=engine.model_path, max_model_len=engine.max_model_len
        )
        for name in names
    ]
    cards += [
        ModelCard(id=adapter.name, created=context.created, root=adapter.path,
                  parent=adapter.base_model_name or names[0], max_model_len=engine.max_model_len)
        for adapter in context.lora_adapters()
    ]
    return cards


@router.get("/v1/models")
async def list_models(context: Context) -> ModelList:
    """The served model names, then each LoRA adapter (`parent` = its base model, `root` = its
    folder); aliases such as "default" are accepted but not listed."""
    return ModelList(data=_cards(context))


@router.get("/v1/models/{model}")
async def retrieve_model(model: str, context: Context) -> ModelCard:
    """One served model by name; 404 model_not_found otherwise."""
    for card in _cards(context):
        if card.id == model:
            return card
    raise ModelNotFound(f"The model `{model}` does not exist.", param="model")

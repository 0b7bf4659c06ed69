"""Model definitions and the table that picks one by architecture name (STYLE §5)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from torch import nn

from engine.errors import ModelLoadError
from engine.models.arch import ModelArch

if TYPE_CHECKING:
    from engine.models.llama import CausalLM

# Hugging Face `architectures[0]` and GGUF `general.architecture` -> "module:Class".
MODEL_REGISTRY: dict[str, str] = {
    "LlamaForCausalLM": "engine.models.llama:CausalLM",
    "MistralForCausalLM": "engine.models.llama:CausalLM",
    "Qwen2ForCausalLM": "engine.models.llama:CausalLM",
    "Qwen3ForCausalLM": "engine.models.llama:CausalLM",
    "llama": "engine.models.llama:CausalLM",
    "qwen2": "engine.models.llama:CausalLM",
    "qwen3": "engine.models.llama:CausalLM",
}


def get_model_class(architecture: str) -> type[CausalLM]:
    """The model class registered for `architecture`, imported on lookup; every entry shares
    CausalLM's constructor and methods. Raises ModelLoadError naming the supported architectures
    when it is unknown."""
    target = MODEL_REGISTRY.get(architecture)
    if target is None:
        supported = ", ".join(sorted(MODEL_REGISTRY))
        raise ModelLoadError(f"unsupported model architecture {architecture!r}; supported: {supported}")
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ModelLoadError(f"registry entry {target!r} is not an nn.Module subclass")
    return cls  # type: ignore[no-any-return]


__all__ = ["MODEL_REGISTRY", "ModelArch", "get_model_class"]

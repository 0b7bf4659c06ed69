"""LoRA adapters: PEFT loading and validation, resident slots, per-token batched application."""

from lora.adapter import LoraAdapter
from lora.batch import LoraBatch
from lora.config import LoraConfig, LoraModuleSpec
from lora.errors import InvalidLoraAdapter, LoraAdapterExists, LoraAdapterNotFound, LoraError, LoraNotEnabled
from lora.manager import LoraManager
from lora.peft_loader import load_peft_adapter
from lora.registry import LoraAdapterInfo, LoraRegistry
from lora.targets import LLAMA_MODULES, LoraModelSpec, LoraTarget, llama_lora_spec

__all__ = [
    "LLAMA_MODULES",
    "InvalidLoraAdapter",
    "LoraAdapter",
    "LoraAdapterExists",
    "LoraAdapterInfo",
    "LoraAdapterNotFound",
    "LoraBatch",
    "LoraConfig",
    "LoraError",
    "LoraManager",
    "LoraModelSpec",
    "LoraModuleSpec",
    "LoraNotEnabled",
    "LoraRegistry",
    "LoraTarget",
    "llama_lora_spec",
    "load_peft_adapter",
]

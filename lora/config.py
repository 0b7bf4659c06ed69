"""LoRA's frozen configuration, built by the CLI in `api/`."""

from __future__ import annotations

from dataclasses import dataclass

from lora.errors import InvalidLoraAdapter


@dataclass(frozen=True, slots=True)
class LoraModuleSpec:
    """An adapter to load at startup: the name clients send as `model`, its PEFT folder, and the
    base model it was trained on (reported as `parent` by /v1/models; None = the served model)."""

    name: str
    path: str
    base_model_name: str | None = None


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """Limits of the LoRA machinery (vLLM's flag names).

    max_loras: adapters resident in the batch slots at once (one forward mixes at most this many).
    max_lora_rank: largest rank accepted; sizes the stacked GPU buffers.
    max_cpu_loras: loaded adapters whose weights stay in host memory (LRU; evicted ones are read
        from their folder again when requested); None = no limit. At least max_loras.
    modules: adapters loaded at startup.
    Raises InvalidLoraAdapter on out-of-range limits or duplicate names.
    """

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    modules: tuple[LoraModuleSpec, ...] = ()

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise InvalidLoraAdapter("max_loras must be >= 1", param="max_loras")
        if not 1 <= self.max_lora_rank <= 512:
            raise InvalidLoraAdapter("max_lora_rank must be between 1 and 512", param="max_lora_rank")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise InvalidLoraAdapter(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})",
                param="max_cpu_loras")
        names = [m.name for m in self.modules]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidLoraAdapter(f"duplicate LoRA module names: {', '.join(duplicates)}", param="lora_modules")

"""Read a PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) and validate it
against the base model. Every problem raises InvalidLoraAdapter with a message for the client."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from lora.adapter import LoraAdapter
from lora.errors import InvalidLoraAdapter
from lora.targets import LoraModelSpec

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (an adapter name may follow lora_A)
_KEY = re.compile(r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)"
                  r"\.lora_([AB])(?:\.[\w-]+)?\.weight$")
# adapter_config fields that change the math of a plain LoRA; a truthy value is refused
_UNSUPPORTED = {
    "modules_to_save": "modules_to_save (full copies of base modules) is not supported",
    "use_dora": "DoRA adapters (use_dora) are not supported",
    "lora_bias": "LoRA bias terms (lora_bias) are not supported",
    "fan_in_fan_out": "fan_in_fan_out adapters are not supported",
    "alpha_pattern": "per-module alpha_pattern is not supported",
    "layer_replication": "layer_replication is not supported",
    "trainable_token_indices": "trainable_token_indices is not supported",
    "target_parameters": "target_parameters is not supported",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens) is not supported",
    "use_qalora": "QA-LoRA (use_qalora) is not supported",
}


def read_adapter_config(folder: Path) -> dict[str, Any]:
    """The parsed adapter_config.json of `folder`; raises InvalidLoraAdapter when the folder or
    either file is missing, or the config is not a LoRA config we can serve."""
    try:
        is_dir = folder.is_dir()
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise InvalidLoraAdapter(f"LoRA adapter folder {folder} cannot be read: {exc.strerror}",
                                 param="lora_path") from None
    if not is_dir:
        raise InvalidLoraAdapter(f"LoRA adapter folder {folder} does not exist", param="lora_path")
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise InvalidLoraAdapter(f"LoRA adapter folder {folder} has no {CONFIG_FILE}", param="lora_path")
    if not (folder / WEIGHTS_FILE).is_file():
        hint = " (adapter_model.bin is not read: save with safe_serialization)" \
            if (folder / "adapter_model.bin").exists() else ""
        raise InvalidLoraAdapter(f"LoRA adapter folder {folder} has no {WEIGHTS_FILE}{hint}", param="lora_path")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidLoraAdapter(f"{config_path} is not valid JSON: {exc}", param="lora_path") from None
    if not isinstance(config, dict):
        raise InvalidLoraAdapter(f"{config_path} must hold a JSON object", param="lora_path")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise InvalidLoraAdapter(f"peft_type {peft_type!r} is not supported (only LORA)", param="lora_path")
    for key, message in _UNSUPPORTED.items():
        if config.get(key):
            raise InvalidLoraAdapter(f"{message}: {key} = {config[key]!r}", param="lora_path")
    if config.get("bias", "none") != "none":
        raise InvalidLoraAdapter(f"bias {config['bias']!r} is not supported (only 'none')", param="lora_path")
    r, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(r, int) or isinstance(r, bool) or r < 1:
        raise InvalidLoraAdapter(f"adapter_config r must be a positive integer, got {r!r}", param="lora_path")
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise InvalidLoraAdapter(f"adapter_config lora_alpha must be a number, got {alpha!r}", param="lora_path")
    return config


def load_peft_adapter(path: str, spec: LoraModelSpec, max_lora_rank: int) -> LoraAdapter:
    """Read and validate the PEFT LoRA adapter in folder `path` for a base model of shape `spec`.

    Raises InvalidLoraAdapter for: missing folder or files; unsupported config (modules_to_save,
    DoRA, bias, ...); a rank above `max_lora_rank`; target modules outside q/k/v/o/gate/up/down;
    tensors whose layers or shapes do not match the base model; missing A/B halves; non-finite
    values. Reads the whole file (seconds for big adapters; call off the event loop).
    """
    try:
        folder = Path(path).expanduser()
    except RuntimeError:  # `~name` of a user that does not exist
        raise InvalidLoraAdapter(f"LoRA adapter folder {path} does not exist", param="lora_path") from None
    config = read_adapter_config(folder)
    r, use_rslora = int(config["r"]), bool(config.get("use_rslora", False))
    alpha = float(config.get("lora_alpha", r))
    targets = config.get("target_modules")
    if isinstance(targets, list):
        unknown = sorted(set(targets) - set(spec.targets))
        if unknown:
            raise InvalidLoraAdapter(
                f"target_modules {unknown} are not supported; LoRA may target {sorted(spec.targets)}",
                param="lora_path")
    halves = _read_halves(folder / WEIGHTS_FILE, spec)
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, module), pair in sorted(halves.items()):
        if "A" not in pair or "B" not in pair:
            missing = "lora_B" if "A" in pair else "lora_A"
            raise InvalidLoraAdapter(f"layer {layer} {module} has no {missing} tensor", param="lora_path")
        lora_a, lora_b = _checked_pair(layer, module, pair["A"], pair["B"], spec, r, config, max_lora_rank)
        rank = lora_a.shape[0]
        scaling = alpha / (math.sqrt(rank) if use_rslora else rank)
        weights[(layer, module)] = (lora_a, lora_b * scaling)
    if not weights:
        raise InvalidLoraAdapter(f"{folder / WEIGHTS_FILE} holds no LoRA tensors", param="lora_path")
    return LoraAdapter(
        path=str(folder), rank=max(a.shape[0] for a, _ in weights.values()), lora_alpha=alpha,
        use_rslora=use_rslora, modules=frozenset(m for _, m in weights), weights=weights)


def _read_halves(file: Path, spec: LoraModelSpec) -> dict[tuple[int, str], dict[str, torch.Tensor]]:
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    try:
        with safe_open(str(file), framework="pt") as handle:
            names = handle.keys()
            for key in names:
                match = _KEY.match(key)
                if match is None:
                    raise InvalidLoraAdapter(
                        f"unexpected tensor {key!r}: only LoRA A/B weights of the layers' "
                        f"{', '.join(spec.targets)} modules are supported", param="lora_path")
                layer, module, half = int(match.group(1)), match.group(2), match.group(3)
                if module not in spec.targets:
                    raise InvalidLoraAdapter(
                        f"tensor {key!r} targets {module}; LoRA may target {sorted(spec.targets)}",
                        param="lora_path")
                if layer >= spec.num_layers:
                    raise InvalidLoraAdapter(
                        f"tensor {key!r} is for layer {layer} but the base model has {spec.num_layers} layers",
                        param="lora_path")
                halves.setdefault((layer, module), {})[half] = handle.get_tensor(key)
    except (SafetensorError, OSError) as exc:
        raise InvalidLoraAdapter(f"cannot read {file}: {exc}", param="lora_path") from None
    return halves


def _checked_pair(layer: int, module: str, lora_a: torch.Tensor, lora_b: torch.Tensor, spec: LoraModelSpec,
                  r: int, config: dict[str, Any], max_lora_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) as float32 after checking them against the base model's module shape."""
    target = spec.targets[module]
    where = f"layer {layer} {module}"
    if lora_a.dim() != 2 or lora_b.dim() != 2:
        raise InvalidLoraAdapter(f"{where}: LoRA tensors must be 2-D", param="lora_path")
    rank = lora_a.shape[0]
    if rank > max_lora_rank:
        raise InvalidLoraAdapter(
            f"{where}: rank {rank} exceeds --max-lora-rank {max_lora_rank}", param="lora_path")
    if rank != r and not config.get("rank_pattern"):
        raise InvalidLoraAdapter(f"{where}: lora_A has rank {rank} but adapter_config r is {r}", param="lora_path")
    expected_a, expected_b = (rank, target.in_features), (target.out_features, rank)
    if tuple(lora_a.shape) != expected_a or tuple(lora_b.shape) != expected_b:
        raise InvalidLoraAdapter(
            f"{where}: lora_A {tuple(lora_a.shape)} / lora_B {tuple(lora_b.shape)} do not fit the base model, "
            f"which needs {expected_a} / {expected_b} (an adapter for another model?)", param="lora_path")
    lora_a, lora_b = lora_a.to(torch.float32), lora_b.to(torch.float32)
    if not (torch.isfinite(lora_a).all() and torch.isfinite(lora_b).all()):
        raise InvalidLoraAdapter(f"{where}: LoRA weights contain NaN or infinity", param="lora_path")
    return lora_a, lora_b

"""Reading a Hugging Face model folder: config.json (+ generation_config.json) and *.safetensors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from engine.errors import ModelLoadError


def read_hf_config(folder: str | Path) -> dict[str, Any]:
    """The folder's config.json as a dict, with eos ids from generation_config.json merged into
    "eos_token_id" (chat models often list their end-of-turn token only there).
    Raises ModelLoadError when config.json is missing or not valid JSON."""
    folder = Path(folder)
    config = _read_json(folder / "config.json")
    if config is None:
        raise ModelLoadError(f"{folder} has no config.json")
    generation = _read_json(folder / "generation_config.json") or {}
    eos_ids: list[int] = []
    for value in (config.get("eos_token_id"), generation.get("eos_token_id")):
        for token_id in [value] if isinstance(value, int) else value or []:
            if token_id not in eos_ids:
                eos_ids.append(int(token_id))
    config["eos_token_id"] = eos_ids or None
    return config


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot parse {path}: {exc}") from exc


def iter_safetensors_weights(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(name, tensor)` (CPU, stored dtype) from every *.safetensors file of the folder,
    with a tqdm bar over the tensors. Raises ModelLoadError when there is no file or one is corrupt."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} has no *.safetensors files")
    try:
        handles = [safe_open(str(path), framework="pt") for path in files]
    except (OSError, SafetensorError) as exc:
        raise ModelLoadError(f"cannot read safetensors in {folder}: {exc}") from exc
    total = sum(len(handle.keys()) for handle in handles)
    with tqdm(total=total, desc="Loading weights", unit="tensor") as progress:
        for handle in handles:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
                progress.update()

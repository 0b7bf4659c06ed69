"""load_peft_adapter: a good peft folder loads with the right scaling folded into B; every kind of
bad folder raises InvalidLoraAdapter with a message that names the problem."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lora.errors import InvalidLoraAdapter
from lora.peft_loader import load_peft_adapter
from lora.targets import llama_lora_spec

# the tiny Llama of lora_support: hidden 64, 4 heads x 16, 2 KV heads, intermediate 128, 2 layers
SPEC = llama_lora_spec(num_layers=2, hidden_size=64, q_size=64, kv_size=32, intermediate_size=128)
PREFIX = "base_model.model.model.layers"


def write_adapter(folder: Path, r: int = 4, alpha: float = 8, modules: tuple[str, ...] = ("q_proj", "v_proj"),
                  layers: int = 2, hidden: int = 64, **config: object) -> dict[str, torch.Tensor]:
    """A PEFT-format folder written by hand (same names and layout as peft's save_pretrained)."""
    folder.mkdir(parents=True, exist_ok=True)
    shapes = {"q_proj": (64, hidden), "k_proj": (32, hidden), "v_proj": (32, hidden), "o_proj": (hidden, 64),
              "gate_proj": (128, hidden), "up_proj": (128, hidden), "down_proj": (hidden, 128)}
    parent = {"gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(layers):
        for module in modules:
            out_f, in_f = shapes[module]
            key = f"{PREFIX}.{layer}.{parent.get(module, 'self_attn')}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(r, in_f, generator=gen)
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_f, r, generator=gen)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    body = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": list(modules), "bias": "none",
            "modules_to_save": None, "use_dora": False, "use_rslora": False, **config}
    (folder / "adapter_config.json").write_text(json.dumps(body))
    return tensors


def test_loads_weights_and_folds_scaling(tmp_path: Path) -> None:
    tensors = write_adapter(tmp_path / "a", r=4, alpha=8)
    adapter = load_peft_adapter(str(tmp_path / "a"), SPEC, max_lora_rank=8)
    assert adapter.rank == 4 and adapter.modules == {"q_proj", "v_proj"} and len(adapter.weights) == 4
    lora_a, lora_b = adapter.weights[(1, "v_proj")]
    key = f"{PREFIX}.1.self_attn.v_proj"
    assert torch.equal(lora_a, tensors[f"{key}.lora_A.weight"])
    torch.testing.assert_close(lora_b, tensors[f"{key}.lora_B.weight"] * 2.0)     # alpha / r
    write_adapter(tmp_path / "rs", r=4, alpha=8, use_rslora=True)
    rs = load_peft_adapter(str(tmp_path / "rs"), SPEC, max_lora_rank=8)
    torch.testing.assert_close(rs.weights[(1, "v_proj")][1], tensors[f"{key}.lora_B.weight"] * 8 / math.sqrt(4))
    assert adapter.projections(SPEC) == {"qkv"}


def test_rank_pattern_takes_ranks_from_the_tensors(tmp_path: Path) -> None:
    write_adapter(tmp_path / "a", r=2, rank_pattern={"q_proj": 2})
    assert load_peft_adapter(str(tmp_path / "a"), SPEC, max_lora_rank=8).rank == 2


def _missing_b(folder: Path) -> None:
    file = folder / "adapter_model.safetensors"
    tensors = {k: v for k, v in load_file(str(file)).items() if not k.endswith("0.self_attn.q_proj.lora_B.weight")}
    save_file(tensors, str(file))


def _lm_head(folder: Path) -> None:
    file = folder / "adapter_model.safetensors"
    save_file({**load_file(str(file)), "base_model.model.lm_head.lora_A.weight": torch.zeros(4, 64)}, str(file))


BAD = {
    "no folder": (lambda f: shutil.rmtree(f), "does not exist"),
    "no config": (lambda f: (f / "adapter_config.json").unlink(), "has no adapter_config.json"),
    "no weights": (lambda f: (f / "adapter_model.safetensors").unlink(), "has no adapter_model.safetensors"),
    "bin only": (lambda f: (f / "adapter_model.safetensors").rename(f / "adapter_model.bin"), "safe_serialization"),
    "bad json": (lambda f: (f / "adapter_config.json").write_text("{r: 4"), "not valid JSON"),
    "corrupt weights": (lambda f: (f / "adapter_model.safetensors").write_bytes(b"\x00" * 20), "cannot read"),
    "missing B": (_missing_b, "layer 0 q_proj has no lora_B"),
    "lm_head": (_lm_head, "unexpected tensor 'base_model.model.lm_head.lora_A.weight'"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_broken_folders_are_refused(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "a"
    write_adapter(folder)
    breaker, message = BAD[name]
    breaker(folder)
    with pytest.raises(InvalidLoraAdapter, match=message) as info:
        load_peft_adapter(str(folder), SPEC, max_lora_rank=8)
    assert info.value.param == "lora_path"


CONFIGS = {
    "rank too large": ({"r": 16}, "rank 16 exceeds --max-lora-rank 8"),
    "modules_to_save": ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    "dora": ({"use_dora": True}, "DoRA"),
    "bias": ({"bias": "all"}, "bias 'all' is not supported"),
    "prefix tuning": ({"peft_type": "PREFIX_TUNING"}, "peft_type 'PREFIX_TUNING'"),
    "target lm_head": ({"target_modules": ["q_proj", "lm_head"]}, r"target_modules \['lm_head'\]"),
    "r mismatch": ({"r_in_config": 3}, "lora_A has rank 4 but adapter_config r is 3"),
    "bad r": ({"r_in_config": 0}, "r must be a positive integer"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_unsupported_configs_are_refused(tmp_path: Path, name: str) -> None:
    overrides, message = CONFIGS[name]
    overrides = dict(overrides)
    r = overrides.pop("r", 4)
    folder = tmp_path / "a"
    write_adapter(folder, r=r, **overrides)
    if "r_in_config" in overrides:
        config = json.loads((folder / "adapter_config.json").read_text())
        config["r"] = config.pop("r_in_config")
        (folder / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidLoraAdapter, match=message):
        load_peft_adapter(str(folder), SPEC, max_lora_rank=8)


def test_adapters_of_other_models_are_refused(tmp_path: Path) -> None:
    write_adapter(tmp_path / "wide", hidden=96)
    with pytest.raises(InvalidLoraAdapter, match=r"do not fit the base model, which needs \(4, 64\)"):
        load_peft_adapter(str(tmp_path / "wide"), SPEC, max_lora_rank=8)
    write_adapter(tmp_path / "deep", layers=3)
    with pytest.raises(InvalidLoraAdapter, match="layer 2 but the base model has 2 layers"):
        load_peft_adapter(str(tmp_path / "deep"), SPEC, max_lora_rank=8)
    nan_folder = tmp_path / "nan"
    tensors = write_adapter(nan_folder)
    tensors[f"{PREFIX}.0.self_attn.q_proj.lora_A.weight"][0, 0] = float("nan")
    save_file(tensors, str(nan_folder / "adapter_model.safetensors"))
    with pytest.raises(InvalidLoraAdapter, match="NaN"):
        load_peft_adapter(str(nan_folder), SPEC, max_lora_rank=8)


@pytest.mark.parametrize("path", ["~no-such-user-structserve/adapter", "a" * 300])
def test_unreadable_paths_are_refused(path: str) -> None:
    # fuzzing regression: `~name` of an unknown user (RuntimeError) and a name the file system
    # refuses (OSError ENAMETOOLONG) escaped as 500s from /v1/load_lora_adapter
    with pytest.raises(InvalidLoraAdapter) as info:
        load_peft_adapter(path, SPEC, max_lora_rank=8)
    assert info.value.param == "lora_path"

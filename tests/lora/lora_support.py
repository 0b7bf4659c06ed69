"""Test support for tests/lora: a tiny random Llama, PEFT adapters made with peft (random, non-zero
B), a byte tokenizer, and an LLMEngine around them. (Named uniquely: tests/ has no __init__.py.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.model_loader import load_model_weights
from engine.request import EngineRequest
from engine.sampling_params import SamplingParams
from lora.config import LoraConfig
from tests.byte_tokenizer import ByteTokenizer

# (r, lora_alpha, target modules, use_rslora): different ranks and targets, one rsLoRA
ADAPTER_SPECS = {
    "ad1": (4, 8, ["q_proj", "v_proj"], False),
    "ad2": (8, 16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], True),
    "ad3": (2, 4, ["o_proj", "down_proj", "up_proj"], False),
}


def save_tiny_llama(folder: Path, seed: int = 0, num_layers: int = 2) -> None:
    """A random float32 LlamaForCausalLM (hidden 64, 4 heads, 2 KV heads, vocab 256) saved to `folder`."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6,
        bos_token_id=None, eos_token_id=0, pad_token_id=None, architectures=["LlamaForCausalLM"])
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.15)
    model.save_pretrained(folder)


def save_peft_adapter(base: Any, folder: Path, r: int, alpha: float, targets: list[str], use_rslora: bool = False,
                      seed: int = 0, scale: float = 0.3) -> None:
    """Wrap transformers model `base` with a peft LoRA, randomize A and B (peft starts B at zero),
    save it with save_pretrained into `folder`, and unwrap `base` again."""
    import peft

    config = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, use_rslora=use_rslora,
                             lora_dropout=0.0, bias="none")
    model = peft.get_peft_model(base, config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    model.save_pretrained(folder)
    model.unload()


def peft_model(base_dir: Path, adapter_dir: Path | None) -> Any:
    """transformers (+ peft when `adapter_dir`) model in float32 eval mode: the reference."""
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    if adapter_dir is None:
        return model
    return peft.PeftModel.from_pretrained(model, adapter_dir).eval()


def reference_greedy(model: Any, prompt: list[int], num_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and the logits `[num_tokens, vocab]` that chose them (full forward per token)."""
    ids = list(prompt)
    rows = []
    with torch.no_grad():
        for _ in range(num_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            rows.append(logits)
            ids.append(int(logits.argmax()))
    return ids[len(prompt):], torch.stack(rows)


def make_adapters(tmp: Path, base_dir: Path, specs: dict[str, tuple] = ADAPTER_SPECS,
                  scale: float = 0.3) -> dict[str, Path]:
    """Save one peft adapter per entry of `specs` under `tmp` (A and B ~ N(0, scale^2));
    returns name -> folder."""
    import transformers

    base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    folders = {}
    for seed, (name, (r, alpha, targets, rslora)) in enumerate(specs.items(), start=1):
        folders[name] = tmp / name
        save_peft_adapter(base, folders[name], r, alpha, targets, rslora, seed=seed, scale=scale)
    return folders


def make_engine(base_dir: Path, lora: LoraConfig | None, tokenizer: Any = None, max_model_len: int | None = None,
                quantization: str = "none", crossover_rows: int | None = None, int4_kernel: str = "auto",
                **overrides: Any) -> LLMEngine:
    """An LLMEngine on the CPU in float32 over the model in `base_dir` (ByteTokenizer by default),
    its weights as `quantization` and `int4_kernel` make them (engine/models/weight_plan.py)."""
    model, arch, max_model_len = load_model_weights(str(base_dir), torch.float32, torch.device("cpu"), max_model_len,
                                                    quantization, crossover_rows, int4_kernel)
    options = {"max_num_seqs": 16, "max_num_batched_tokens": 256, "block_size": 4,
               "kv_cache_memory_bytes": 2 * 1024**2, "lora": lora, **overrides}
    config = EngineConfig(**options)
    return LLMEngine(config, model, arch, tokenizer or ByteTokenizer(eos_token_id=0), torch.device("cpu"), torch.float32,
                     max_model_len)


def greedy_request(request_id: str, prompt: list[int], max_tokens: int, lora_name: str | None) -> EngineRequest:
    """A greedy request that ignores EOS."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return EngineRequest(request_id, prompt, params, lora_name=lora_name, arrival_time=time.monotonic())


def run_to_completion(engine: LLMEngine, max_steps: int = 10_000) -> dict[str, list[int]]:
    """Step until idle; returns request_id -> generated token ids. Checks scheduler invariants."""
    tokens: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return tokens
        for out in engine.step():
            assert out.error is None, out.error
            for delta in out.deltas:
                tokens.setdefault(out.request_id, []).extend(delta.token_ids)
        engine.scheduler.check_invariants()
    raise AssertionError("engine did not finish")

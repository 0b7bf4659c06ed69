"""Reading a GGUF file: a Hugging Face-style config from its metadata, and its tensors under Hugging
Face names (so `CausalLM.load_weights` serves both formats), quantized blocks kept as they are."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np
import torch
from tqdm import tqdm

from engine.errors import ModelLoadError
from engine.gguf_blocks import BLOCK_TYPES, unpack_blocks
from engine.gguf_header import GgufFile, read_gguf
from engine.models.quantized_tensor import SourceWeight

# GGUF `general.architecture` -> Hugging Face architecture name.
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
SUPPORTED_TENSOR_TYPES = frozenset(
    {
        gguf.GGMLQuantizationType.F32,
        gguf.GGMLQuantizationType.F16,
        gguf.GGMLQuantizationType.BF16,
        gguf.GGMLQuantizationType.Q8_0,
        gguf.GGMLQuantizationType.Q4_0,
        gguf.GGMLQuantizationType.Q4_1,
    }
)
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs.weight",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def open_gguf(path: str) -> GgufFile:
    """Memory-map a GGUF file (`engine/gguf_header.py`) and check every tensor type is one we can
    dequantize. Raises ModelLoadError when the file cannot be parsed or holds an unsupported tensor type."""
    try:
        reader = read_gguf(path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read GGUF file {path}: {exc}") from exc
    supported = ", ".join(sorted(t.name for t in SUPPORTED_TENSOR_TYPES))
    for tensor in reader.tensors:
        if tensor.tensor_type not in SUPPORTED_TENSOR_TYPES:
            raise ModelLoadError(
                f"GGUF tensor {tensor.name} has unsupported type {tensor.tensor_type.name}; "
                f"supported: {supported}"
            )
    return reader


def _field(reader: GgufFile, key: str, default: Any = None) -> Any:
    return reader.fields.get(key, default)


def gguf_config(reader: GgufFile) -> dict[str, Any]:
    """A `config.json`-shaped dict (for `ModelArch.from_hf_config`) from the GGUF metadata.
    Raises ModelLoadError for an unsupported architecture or missing metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        supported = ", ".join(sorted(GGUF_ARCHITECTURES))
        raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {supported}")
    names = {tensor.name: tensor for tensor in reader.tensors}
    if "token_embd.weight" not in names:
        raise ModelLoadError("GGUF file has no token_embd.weight tensor")
    try:
        num_heads = int(_field(reader, f"{arch}.attention.head_count"))
        config: dict[str, Any] = {
            "architectures": [GGUF_ARCHITECTURES[arch]],
            "vocab_size": int(names["token_embd.weight"].shape[-1]),
            "hidden_size": int(_field(reader, f"{arch}.embedding_length")),
            "num_hidden_layers": int(_field(reader, f"{arch}.block_count")),
            "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length")),
            "num_attention_heads": num_heads,
            "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", num_heads)),
            "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
            "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
            "max_position_embeddings": int(_field(reader, f"{arch}.context_length")),
            "tie_word_embeddings": "output.weight" not in names,
            "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
            "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
            "attention_bias": "blk.0.attn_q.bias" in names,
        }
    except TypeError as exc:  # int(None): a required key is absent
        raise ModelLoadError(f"GGUF metadata for {arch!r} is incomplete: {exc}") from exc
    head_dim = _field(reader, f"{arch}.attention.key_length")
    if head_dim is not None:
        config["head_dim"] = int(head_dim)
    scaling_type = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", "linear"):
        raise ModelLoadError(f"unsupported GGUF RoPE scaling {scaling_type!r}; supported: none, linear")
    if scaling_type == "linear":
        factor = float(_field(reader, f"{arch}.rope.scaling.factor"))
        config["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    return config


def hf_tensor_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor (`blk.3.attn_q.weight` ->
    `model.layers.3.self_attn.q_proj.weight`); unknown names come back unchanged."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _BLOCK_RE.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_NAMES:
        return gguf_name
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation for its interleaved RoPE (as transformers'
    `_reverse_permute_weights`): rows `[num_heads * head_dim]` of a weight `[rows, in]` or bias."""
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def iter_gguf_weights(reader: GgufFile, config: dict[str, Any]) -> Iterator[tuple[str, SourceWeight]]:
    """Yield `(hf_name, weight)` for every tensor: Q4_0/Q4_1 as Int4Groups and Q8_0 as Int8Groups
    (the file's values, unpacked, engine/gguf_blocks.py), other types dequantized to float32; q/k
    rows restored to the Hugging Face layout for llama-arch files. Shows a tqdm bar over the tensors."""
    permuted = config["architectures"][0] == "LlamaForCausalLM"
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    for tensor in tqdm(reader.tensors, desc="Loading weights", unit="tensor"):
        shape = [int(d) for d in reversed(tensor.shape)]
        weight: SourceWeight
        if tensor.tensor_type in BLOCK_TYPES and len(shape) == 2:
            weight = unpack_blocks(tensor.data, tensor.tensor_type, shape)
        else:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            if not array.flags.writeable:  # F32 tensors come back as views of the read-only map
                array = np.array(array)
            weight = torch.from_numpy(array).reshape(shape)
        name = hf_tensor_name(tensor.name)
        proj = name.split(".")[-2]
        if permuted and proj in heads:
            count = heads[proj]
            weight = (unpermute_rope_rows(weight, count) if isinstance(weight, torch.Tensor)
                      else weight.map_rows(lambda rows, count=count: unpermute_rope_rows(rows, count)))
        yield name, weight

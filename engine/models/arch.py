"""The shape of a decoder model, read once from a Hugging Face config (or a GGUF's metadata)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ModelLoadError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True, slots=True)
class ModelArch:
    """Architecture hyper-parameters of a Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2/3).

    rope_scaling: None (plain RoPE) or a dict with "rope_type" "linear" (key "factor") or "llama3"
    (keys factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
    attention_bias: q/k/v projections carry a bias (Qwen2; Llama with attention_bias).
    o_proj_bias: the output projection carries a bias (Llama with attention_bias only).
    qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
    max_position_embeddings: the longest sequence the model supports (capped at the sliding window
    for models that use one, so full attention stays exact).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    o_proj_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads != 0:
            raise ModelLoadError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ModelLoadError(f"head_dim must be even for RoPE, got {self.head_dim}")

    def kv_cache_bytes_per_block(self, block_size: int, element_size: int) -> int:
        """Bytes one KV block takes over all layers, K and V together, at `element_size` bytes per
        value (4 for float32, 2 for bfloat16); divide the KV memory budget by it for num_blocks."""
        return 2 * self.num_layers * block_size * self.num_kv_heads * self.head_dim * element_size

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelArch:
        """Build from a parsed `config.json` (transformers 4.x `rope_theta`/`rope_scaling` or 5.x
        `rope_parameters`). Raises ModelLoadError for unsupported architectures, RoPE types, MLP
        activations or missing keys."""
        architectures = config.get("architectures") or []
        if not architectures:
            raise ModelLoadError("config.json has no 'architectures' entry")
        architecture = architectures[0]
        if config.get("hidden_act", "silu") != "silu":
            raise ModelLoadError(f"unsupported hidden_act {config['hidden_act']!r}; only 'silu' is supported")
        if config.get("mlp_bias"):
            raise ModelLoadError("mlp_bias=True is not supported")
        try:
            hidden_size = int(config["hidden_size"])
            num_heads = int(config["num_attention_heads"])
            rope_theta, rope_scaling = _rope_from_config(config)
            is_qwen2 = architecture == "Qwen2ForCausalLM"
            attention_bias = bool(config.get("attention_bias", is_qwen2))
            return cls(
                architecture=architecture,
                vocab_size=int(config["vocab_size"]),
                hidden_size=hidden_size,
                num_layers=int(config["num_hidden_layers"]),
                num_heads=num_heads,
                num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
                head_dim=int(config.get("head_dim") or hidden_size // num_heads),
                intermediate_size=int(config["intermediate_size"]),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                attention_bias=attention_bias,
                qk_norm=architecture == "Qwen3ForCausalLM",
                max_position_embeddings=_max_positions(config, architecture),
                bos_token_id=config.get("bos_token_id"),
                eos_token_ids=_eos_ids(config.get("eos_token_id")),
                o_proj_bias=attention_bias and not is_qwen2,
            )
        except KeyError as exc:
            raise ModelLoadError(f"config.json lacks required key {exc.args[0]!r}") from exc


def _rope_from_config(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling or None) from either config generation; validates the type."""
    params = dict(config.get("rope_parameters") or {})
    scaling = dict(config.get("rope_scaling") or {})
    merged = {**params, **scaling}
    theta = float(merged.pop("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = merged.get("rope_type", merged.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ModelLoadError(
            f"unsupported RoPE type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    needed = _LLAMA3_ROPE_KEYS if rope_type == "llama3" else ("factor",)
    missing = [key for key in needed if key not in merged]
    if missing:
        raise ModelLoadError(f"{rope_type} RoPE scaling lacks {', '.join(missing)}")
    return theta, {"rope_type": rope_type, **{key: merged[key] for key in needed}}


def _max_positions(config: dict[str, Any], architecture: str) -> int:
    max_positions = int(config.get("max_position_embeddings", 2048))
    window = config.get("sliding_window")
    uses_window = config.get("use_sliding_window", architecture == "MistralForCausalLM")
    if uses_window and window:
        max_positions = min(max_positions, int(window))
    return max_positions


def _eos_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(token_id) for token_id in value)

"""ModelArch.from_hf_config across config generations and families."""

from __future__ import annotations

import pytest

from engine.errors import ModelLoadError
from engine.models.arch import ModelArch

BASE = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072, "bos_token_id": 1, "eos_token_id": [2, 7],
}


def test_transformers_4_llama3_config() -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    arch = ModelArch.from_hf_config({**BASE, "rope_theta": 500000.0, "rope_scaling": scaling})
    assert (arch.head_dim, arch.rope_theta, arch.rope_scaling) == (128, 500000.0, scaling)
    assert (arch.eos_token_ids, arch.bos_token_id, arch.tie_word_embeddings) == ((2, 7), 1, False)
    assert not (arch.attention_bias or arch.o_proj_bias or arch.qk_norm)
    assert arch.kv_cache_bytes_per_block(16, 2) == 2 * 32 * 16 * 8 * 128 * 2


def test_transformers_5_rope_parameters_and_old_linear_type() -> None:
    arch = ModelArch.from_hf_config({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert (arch.rope_theta, arch.rope_scaling) == (1e6, None)
    arch = ModelArch.from_hf_config({**BASE, "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert arch.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_family_specifics() -> None:
    unused_window = {"sliding_window": 4096, "use_sliding_window": False}
    qwen2 = ModelArch.from_hf_config({**BASE, "architectures": ["Qwen2ForCausalLM"], **unused_window})
    assert (qwen2.attention_bias, qwen2.o_proj_bias, qwen2.max_position_embeddings) == (True, False, 131072)
    qwen3 = ModelArch.from_hf_config({**BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 64})
    assert (qwen3.qk_norm, qwen3.head_dim, qwen3.attention_bias) == (True, 64, False)
    window = {"sliding_window": 4096}
    mistral = ModelArch.from_hf_config({**BASE, "architectures": ["MistralForCausalLM"], **window})
    assert mistral.max_position_embeddings == 4096  # full attention is exact only inside the window
    llama_bias = ModelArch.from_hf_config({**BASE, "attention_bias": True})
    assert (llama_bias.attention_bias, llama_bias.o_proj_bias) == (True, True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "lacks low_freq_factor"),
        ({"num_key_value_heads": 5}, "multiple of num_kv_heads"),
        ({"architectures": []}, "no 'architectures'"),
    ],
)
def test_invalid_configs(change: dict, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        ModelArch.from_hf_config({**BASE, **change})


def test_missing_key() -> None:
    config = dict(BASE)
    del config["intermediate_size"]
    with pytest.raises(ModelLoadError, match="lacks required key 'intermediate_size'"):
        ModelArch.from_hf_config(config)

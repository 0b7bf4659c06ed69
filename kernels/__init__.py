"""Triton kernels, each beside the pure-torch reference that CPU runs use."""

from kernels.lora_expand import lora_expand, lora_expand_ref, lora_expand_triton
from kernels.lora_index import LoraTokenIndex, lora_token_index
from kernels.lora_shrink import lora_shrink, lora_shrink_ref, lora_shrink_triton
from kernels.paged_attention import (
    paged_attention,
    paged_attention_ref,
    paged_attention_triton,
    paged_decode_attention,
    write_kv,
    write_kv_ref,
    write_kv_scratch,
    write_kv_triton,
)

__all__ = [
    "LoraTokenIndex",
    "lora_expand",
    "lora_expand_ref",
    "lora_expand_triton",
    "lora_shrink",
    "lora_shrink_ref",
    "lora_shrink_triton",
    "lora_token_index",
    "paged_attention",
    "paged_attention_ref",
    "paged_attention_triton",
    "paged_decode_attention",
    "write_kv",
    "write_kv_ref",
    "write_kv_scratch",
    "write_kv_triton",
]

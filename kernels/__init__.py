"""Triton kernels, each beside the pure-torch reference that CPU runs use."""

from kernels.paged_attention import (
    paged_attention,
    paged_attention_ref,
    paged_attention_triton,
    write_kv,
    write_kv_ref,
    write_kv_triton,
)

__all__ = [
    "paged_attention",
    "paged_attention_ref",
    "paged_attention_triton",
    "write_kv",
    "write_kv_ref",
    "write_kv_triton",
]

"""The token embedding lookup, over a dense table or over int8 rows (each row dequantized on lookup)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.models.quantized_tensor import Int8Channels
from kernels.w8a16_linear import w8a16_rows


class TokenEmbedding(nn.Module):
    """`input_ids` -> rows `[num_tokens, hidden_size]` in `dtype`.

    Holds either `table` (dense `[vocab, hidden]`, looked up as is) or `int8` (per-row int8 and
    float32 scales; only the looked-up rows are dequantized). With tied embeddings the int8 rows
    are the LM head's INT8 copy itself, so the table is held once: the same tensor as `int8.qvals`
    for a row-major head, or `packed`, the head's w8a16 layout of those values (uint8
    `[ceil(vocab / 16), hidden * 16]`, kernels/w8a16_linear.py), which the lookup then reads rows
    out of (`int8.qvals` is not kept).
    """

    def __init__(self, dtype: torch.dtype, table: torch.Tensor | None = None, int8: Int8Channels | None = None,
                 shares_rows: bool = False, packed: torch.Tensor | None = None) -> None:
        super().__init__()
        if (table is None) == (int8 is None):
            raise ValueError("TokenEmbedding needs exactly one of a dense table and int8 rows")
        if packed is not None and int8 is None:
            raise ValueError("packed int8 rows need their int8 scales")
        self.dtype = dtype
        self.shares_rows = shares_rows   # the int8 rows belong to the LM head (counted there)
        self.register_buffer("table", table, persistent=False)                                     # [vocab, hidden]
        rows = None if int8 is None else (packed if packed is not None else int8.qvals)
        self.register_buffer("int8_rows", rows, persistent=False)   # int8 [vocab, hidden], or the w8a16 layout
        self.register_buffer("int8_scales", None if int8 is None else int8.scales.float(), persistent=False)  # [vocab]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`input_ids` int64 `[num_tokens]`, each < vocab -> `[num_tokens, hidden]` in the model dtype."""
        if self.table is not None:
            return F.embedding(input_ids, self.table)
        if self.int8_rows.dtype == torch.uint8:
            rows = w8a16_rows(self.int8_rows, input_ids).float()
        else:
            rows = self.int8_rows.index_select(0, input_ids).float()
        return rows.mul_(self.int8_scales.index_select(0, input_ids)[:, None]).to(self.dtype)

    def resident_bytes(self) -> int:
        """Bytes this lookup holds of its own (rows shared with the LM head are not counted)."""
        tensors = [self.table, self.int8_scales] + ([] if self.shares_rows else [self.int8_rows])
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

"""GGUF's Q4_0, Q4_1 and Q8_0 blocks unpacked into quantized groups, values kept exactly.

Layouts (ggml's `block_q4_0`, `block_q4_1`, `block_q8_0`; 32 weights of one row per block):
Q4_0 = fp16 d + 16 bytes of nibbles, w = d * (q - 8); Q4_1 = fp16 d, fp16 m + 16 bytes, w = d * q + m;
Q8_0 = fp16 d + 32 int8, w = d * q. Byte j of the nibbles holds weight j in its low and weight
j + 16 in its high nibble.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

from engine.models.quantized_tensor import GROUP_SIZE, Int4Groups, Int8Groups

# type -> (bytes of fp16 fields before the quants, bytes per block)
_LAYOUTS = {
    gguf.GGMLQuantizationType.Q4_0: (2, 18),
    gguf.GGMLQuantizationType.Q4_1: (4, 20),
    gguf.GGMLQuantizationType.Q8_0: (2, 34),
}
BLOCK_TYPES = frozenset(_LAYOUTS)


def unpack_blocks(data: np.ndarray, tensor_type: gguf.GGMLQuantizationType, shape: list[int]) -> Int4Groups | Int8Groups:
    """The tensor `shape` = `[out, in]` (torch order) from its raw blocks `data` (uint8, one row
    of blocks per output row, as `GGUFReader` maps it). Raises KeyError for another type."""
    header, block_bytes = _LAYOUTS[tensor_type]
    out_features, in_features = shape
    rows = np.array(data, dtype=np.uint8)   # a writable copy of the read-only map
    blocks = torch.from_numpy(rows).reshape(out_features, in_features // GROUP_SIZE, block_bytes)
    halves = blocks[..., :header].contiguous().view(torch.float16).float()   # [out, groups, 1 or 2]
    quants = blocks[..., header:]
    if tensor_type == gguf.GGMLQuantizationType.Q8_0:
        return Int8Groups(quants.contiguous().view(torch.int8).reshape(shape), halves[..., 0])
    qvals = torch.cat([quants & 0x0F, quants >> 4], dim=-1).reshape(shape)
    scales = halves[..., 0]
    zeros = halves[..., 1] + 8 * scales if tensor_type == gguf.GGMLQuantizationType.Q4_1 else torch.zeros_like(scales)
    return Int4Groups(qvals, scales, zeros)

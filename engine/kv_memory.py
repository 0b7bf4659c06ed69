"""The paged KV cache's memory: zeroed, and on CPU resident only where blocks have been written.

Why: `torch.zeros` on CPU writes every byte, so a 512 MiB cache is 512 MiB of resident memory from
the first second, although a server usually holds far fewer tokens than its cache can. An anonymous
`mmap` is zero-filled by the kernel page by page on first touch (mmap(2), MAP_ANONYMOUS: "its
contents are initialized to zero"), so the cache reads as zeros everywhere, as the masked attention
reductions need (0 * garbage could be NaN), and costs memory only for the blocks the block pool has
handed out at least once.
"""

from __future__ import annotations

import math
import mmap

import torch


def zeroed_cache(num_tensors: int, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device) -> list[torch.Tensor]:
    """`num_tensors` zero tensors of `shape` and `dtype` on `device`, views into one allocation.

    On CPU the allocation is one anonymous memory mapping (pages resident once written); elsewhere
    `torch.zeros`. Each tensor is contiguous and does not overlap the others.
    """
    if device.type != "cpu":
        return list(torch.zeros((num_tensors, *shape), dtype=dtype, device=device).unbind(0))
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = num_tensors * math.prod(shape) * itemsize
    mapping = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # the tensors keep the buffer (and so the mapping) alive through frombuffer's reference
    flat = torch.frombuffer(mapping, dtype=dtype, count=nbytes // itemsize)
    return list(flat.view(num_tensors, *shape).unbind(0))

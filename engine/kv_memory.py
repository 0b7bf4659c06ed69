"""The paged KV cache's memory: zeroed, and on CPU resident only where blocks have been written.

Why: `torch.zeros` on CPU writes every byte, so a 512 MiB cache is 512 MiB of resident memory from
the first second, although a server usually holds far fewer tokens than its cache can. An anonymous
`mmap` is zero-filled by the kernel page by page on first touch (mmap(2), MAP_ANONYMOUS: "its
contents are initialized to zero"), so the cache reads as zeros everywhere, as the masked attention
reductions need (0 * garbage could be NaN), and costs memory only for the blocks the block pool has
handed out at least once.

Each tensor has a storage of its own (one mapping per tensor, not views into one): torch.compile
treats graph inputs that share a storage as aliases, and functionalizing a K/V write into one of
them copies the whole storage, then copies it back (seen on the compiled decode step: every layer
copied both caches in full each step, ~80 ms a token with a 2 GiB cache, and made all of it
resident). Separate storages let inductor write the new slots in place.
"""

from __future__ import annotations

import math
import mmap

import torch


def zeroed_cache(num_tensors: int, shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device) -> list[torch.Tensor]:
    """`num_tensors` zero tensors of `shape` and `dtype` on `device`, each with its own storage.

    On CPU each storage is one anonymous memory mapping (pages resident once written); elsewhere
    `torch.zeros`. Each tensor is contiguous and shares no storage with the others.
    """
    if device.type != "cpu":
        return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_tensors)]
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = math.prod(shape)
    return [_mapped_zeros(numel, itemsize, dtype).view(shape) for _ in range(num_tensors)]


def _mapped_zeros(numel: int, itemsize: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat zero tensor of `numel` elements over an anonymous mapping of its own."""
    mapping = mmap.mmap(-1, max(numel * itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # the tensor keeps the buffer (and so the mapping) alive through frombuffer's reference
    return torch.frombuffer(mapping, dtype=dtype, count=numel)

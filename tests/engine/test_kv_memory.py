"""The KV cache's memory: zeros everywhere, separate tensors, and on CPU resident only once written."""

from __future__ import annotations

import torch

from engine.kv_memory import zeroed_cache


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_zeroed_cache_is_zero_and_tensors_do_not_overlap() -> None:
    caches = zeroed_cache(4, (3, 16, 2, 8), torch.float32, torch.device("cpu"))
    assert len(caches) == 4
    assert all(c.shape == (3, 16, 2, 8) and c.dtype == torch.float32 and c.is_contiguous() for c in caches)
    assert all(bool((c == 0).all()) for c in caches)
    caches[1].fill_(7.0)
    assert bool((caches[0] == 0).all()) and bool((caches[2] == 0).all()) and bool((caches[1] == 7).all())


def test_zeroed_cache_tensors_have_storages_of_their_own() -> None:
    """Views of one storage are aliases to torch.compile: a K/V write would copy the whole storage."""
    caches = zeroed_cache(4, (3, 16, 2, 8), torch.float32, torch.device("cpu"))
    pointers = {c.untyped_storage().data_ptr() for c in caches}
    assert len(pointers) == 4
    assert all(c.untyped_storage().nbytes() == c.numel() * c.element_size() for c in caches)


def test_zeroed_cache_becomes_resident_only_where_written() -> None:
    before = _rss_mib()
    caches = zeroed_cache(8, (1024, 16, 4, 64), torch.float32, torch.device("cpu"))   # 128 MiB
    assert _rss_mib() - before < 32, "an untouched cache must not be resident"
    caches[0][:512].fill_(1.0)                                                          # 8 MiB written
    grown = _rss_mib() - before
    assert 6 < grown < 48, grown


def test_zeroed_cache_bf16() -> None:
    caches = zeroed_cache(2, (2, 4, 1, 4), torch.bfloat16, torch.device("cpu"))
    assert caches[0].dtype == torch.bfloat16 and bool((caches[1] == 0).all())

"""Chained 128-bit digests of full KV blocks, the keys of the prefix cache."""

from __future__ import annotations

import hashlib
from array import array

# A fixed key keeps digests stable across processes (the built-in hash() is salted per process).
_HASH_KEY = b"structserve-prefix-cache-v1"
ROOT_HASH = b"\x00" * 16


def hash_block(parent_hash: bytes, token_ids: list[int], adapter_id: int, cache_salt: str = "") -> bytes:
    """Digest of one full block: blake2b-128 over (parent digest, token ids, adapter id, salt).

    token_ids: exactly block_size ids. Returns 16 bytes. Two blocks share a digest only when
    their whole prefix, their tokens, their LoRA adapter and salt are the same.
    """
    h = hashlib.blake2b(digest_size=16, key=_HASH_KEY)
    h.update(parent_hash)
    h.update(array("q", token_ids).tobytes())
    h.update(adapter_id.to_bytes(8, "little", signed=True))
    if cache_salt:
        h.update(cache_salt.encode())
    return h.digest()


def hash_full_blocks(
    token_ids: list[int], block_size: int, adapter_id: int, start_hashes: list[bytes], num_tokens: int,
    cache_salt: str | None = None,
) -> list[bytes]:
    """Extend `start_hashes` (digests of the first blocks) to cover every full block of
    `token_ids[:num_tokens]`. Returns a new list; `start_hashes` is not changed.

    `cache_salt` (the request's, vLLM's field) goes into the first block's digest only: every
    later digest chains from it, so requests with different salts share no block and requests
    with the same salt (or none) share their common full blocks as before."""
    hashes = list(start_hashes)
    parent = hashes[-1] if hashes else ROOT_HASH
    for block_idx in range(len(hashes), num_tokens // block_size):
        start = block_idx * block_size
        salt = (cache_salt or "") if block_idx == 0 else ""
        parent = hash_block(parent, token_ids[start:start + block_size], adapter_id, salt)
        hashes.append(parent)
    return hashes

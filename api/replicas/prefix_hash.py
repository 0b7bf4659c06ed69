"""A request body's prompt prefix as a chain of chunk hashes, for prefix-aware routing.

The router sees the raw body, not the rendered prompt, so it hashes what the prompt is rendered
from, in the order the chat template writes it: the model (the adapter: prefix-cache blocks are
keyed by adapter), the tools, the system prompt (`instructions` on Responses, `system` on
Messages), then each message / input item / completion prompt. Each part is canonical JSON (keys
sorted, no spaces); their concatenation is cut into `PREFIX_CHUNK_CHARS`-character chunks and each
full chunk hashed with its parent's digest (blake2b-128), like the engine's block hashes: two bodies
share the first k hashes exactly when their first k chunks agree. A trailing partial chunk is not
hashed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

PREFIX_CHUNK_CHARS = 256
_MAX_CHUNKS = 1024   # 256 KiB of prompt text: enough to tell prefixes apart, bounded work per request


def prompt_parts(body: dict[str, Any]) -> list[Any]:
    """The parts of an OpenAI chat / completions / Responses or Anthropic Messages body that shape
    its prompt, in prompt order (a body of another shape gives only its model)."""
    parts: list[Any] = [body.get("model")]
    for key in ("tools", "instructions", "system"):
        if body.get(key) is not None:
            parts.append(body[key])
    for key in ("messages", "input", "prompt"):
        value = body.get(key)
        if isinstance(value, list):
            parts.extend(value)
        elif value is not None:
            parts.append(value)
    return parts


def prefix_hashes(body: dict[str, Any]) -> tuple[bytes, ...]:
    """The chained 16-byte digests of the body's full prompt chunks (see the module docstring)."""
    text = "".join(json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                   for part in prompt_parts(body))
    digests: list[bytes] = []
    parent = b""
    num_chunks = min(len(text) // PREFIX_CHUNK_CHARS, _MAX_CHUNKS)
    for i in range(num_chunks):
        chunk = text[i * PREFIX_CHUNK_CHARS:(i + 1) * PREFIX_CHUNK_CHARS].encode("utf-8")
        parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
        digests.append(parent)
    return tuple(digests)

"""The raw bytes of one vocabulary token, for logprobs' `bytes` field and their token strings."""

from __future__ import annotations

import json
import re
from typing import Any

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SENTENCEPIECE_SPACE = "\u2581"


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, inverted: the printable character standing for each byte
    -> that byte (the `bytes_to_unicode` table of OpenAI's GPT-2 encoder, which the Hugging Face
    `ByteLevel` pre-tokenizer and decoder use): bytes 33-126, 161-172 and 174-255 stand for
    themselves, the other 68 map to U+0100 onwards in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table = {chr(b): b for b in kept}
    shifted = 0
    for b in range(256):
        if b not in kept:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


class TokenBytes:
    """Raw bytes per token id of a tokenizer, read from its vocabulary and cached per id.

    Byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen: a `ByteLevel` decoder) maps each character of
    the token string back to its byte; SentencePiece with byte fallback (Llama 2, Mistral) writes
    `<0xNN>` for a byte and U+2581 for a space. For any other tokenizer (or an id the vocabulary
    has no string for) `bytes_of` falls back to the UTF-8 of the token's decoded text, in which a
    token holding part of a multi-byte character reads as U+FFFD.
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._kind = _vocab_kind(tokenizer)
        self._alphabet = byte_level_alphabet() if self._kind == "byte_level" else {}
        self._cache: dict[int, bytes] = {}

    def bytes_of(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for, a partial UTF-8 character included (see the
        class docstring for tokenizers whose vocabulary does not say)."""
        value = self._cache.get(token_id)
        if value is None:
            value = self._read(token_id)
            if value is None:
                value = self._tokenizer.decode([token_id]).encode("utf-8")
            self._cache[token_id] = value
        return value

    def _read(self, token_id: int) -> bytes | None:
        if self._kind is None:
            return None
        piece = self._tokenizer.convert_ids_to_tokens([token_id])[0]
        if not isinstance(piece, str):
            return None
        if self._kind == "byte_level":
            if any(ch not in self._alphabet for ch in piece):
                return piece.encode("utf-8")          # an added token is stored as plain text
            return bytes(self._alphabet[ch] for ch in piece)
        match = _BYTE_FALLBACK.fullmatch(piece)
        if match is not None:
            return bytes([int(match.group(1), 16)])
        return piece.replace(_SENTENCEPIECE_SPACE, " ").encode("utf-8")


def _vocab_kind(tokenizer: Any) -> str | None:
    """"byte_level", "sentencepiece" (byte fallback) or None, from a Hugging Face fast tokenizer's
    decoder (its Rust `tokenizers.Tokenizer`, `tokenizer._tokenizer`)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    to_str = getattr(backend, "to_str", None)
    if to_str is None:
        return None
    decoder = json.loads(to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders") or []}
    if "ByteLevel" in kinds:
        return "byte_level"
    if "ByteFallback" in kinds:
        return "sentencepiece"
    return None

"""VocabInfo: the tokenizer facts every grammar backend needs, built once per served model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from constrained.errors import GrammarConfigError


@dataclass(frozen=True, slots=True, eq=False)
class VocabInfo:
    """A Hugging Face tokenizer plus the model's logits width and its EOS ids.

    `tokenizer`: a transformers fast tokenizer (PreTrainedTokenizerFast / TokenizersBackend);
    backends read its vocabulary, they never call it on the hot path.
    `vocab_size`: the MODEL's logits width (config.vocab_size), which may exceed
    `len(tokenizer)`; every bitmask is int32 `[num_rows, ceil(vocab_size / 32)]`.
    `eos_token_ids`: ids that end a sequence; a matcher allows them only at an accepting state.
    `special_token_texts`: text of the tokenizer's special added tokens (e.g. "<|im_end|>").
    Raises GrammarConfigError on a non-positive vocab_size, no EOS id or an EOS id out of range.
    """

    tokenizer: Any
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    special_token_texts: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.vocab_size <= 0:
            raise GrammarConfigError(f"vocab_size must be > 0, got {self.vocab_size}", param="vocab_size")
        if not self.eos_token_ids:
            raise GrammarConfigError("at least one EOS token id is required", param="eos_token_ids")
        bad = [i for i in self.eos_token_ids if not 0 <= i < self.vocab_size]
        if bad:
            raise GrammarConfigError(
                f"EOS token ids {bad} are outside [0, {self.vocab_size})", param="eos_token_ids"
            )

    @classmethod
    def from_huggingface(
        cls, tokenizer: Any, vocab_size: int | None = None, eos_token_ids: list[int] | None = None
    ) -> VocabInfo:
        """Build from a transformers tokenizer; `vocab_size` defaults to `len(tokenizer)`.

        `eos_token_ids` defaults to `[tokenizer.eos_token_id]`. Raises GrammarConfigError
        when neither is available or the values are invalid.
        """
        if eos_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            eos_token_ids = [] if eos is None else [int(eos)]
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        specials = frozenset(tok.content for tok in decoder.values() if getattr(tok, "special", False))
        return cls(
            tokenizer=tokenizer,
            vocab_size=int(vocab_size if vocab_size is not None else len(tokenizer)),
            eos_token_ids=tuple(int(i) for i in eos_token_ids),
            special_token_texts=specials,
        )

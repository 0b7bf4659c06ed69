"""One fake tokenizer for the tests that need no real vocabulary: token id = UTF-8 byte value,
ids 256.. are the given special tokens. It has what the engine's detokenizer, VocabInfo and the
api's chat rendering read (`encode`, `decode`, `added_tokens_decoder`, `len`, `chat_template`,
`apply_chat_template`, `convert_ids_to_tokens`). No BOS is added (like SmolLM2's GGUF)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment


class ByteTokenizer:
    """Byte-level tokens plus `special_tokens` (ids 256, 257, ...); `eos_token_id` as given.

    `decode` replaces invalid UTF-8 (a multi-byte character cut in the middle) with U+FFFD and
    writes special tokens unless `skip_special_tokens`. `apply_chat_template` renders a Jinja
    template (its `chat_template`, or the one passed) with transformers' loopcontrols and a plain
    `tojson`; it only renders (`tokenize=False`).
    """

    def __init__(self, special_tokens: Sequence[str] = (), eos_token_id: int | None = None,
                 chat_template: str | None = None) -> None:
        self.special_tokens = list(special_tokens)
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template
        self.vocab_size = 256 + len(self.special_tokens)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        """The special tokens by id (what VocabInfo reads)."""
        return {256 + i: token for i, token in enumerate(self.special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """UTF-8 bytes, with each special token's text as its one id."""
        ids: list[int] = []
        i = 0
        while i < len(text):
            special = next((s for s in self.special_tokens if text.startswith(s, i)), None)
            if special is not None:
                ids.append(256 + self.special_tokens.index(special))
                i += len(special)
            else:
                ids.extend(text[i].encode("utf-8"))
                i += 1
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        """The text of `token_ids` (see the class docstring)."""
        out, pending = [], bytearray()
        for t in token_ids:
            if t < 256:
                pending.append(t)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending = bytearray()
            if not skip_special_tokens:
                out.append(self.special_tokens[t - 256])
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]:
        """One decoded string per id."""
        return [self.decode([t]) for t in token_ids]

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        **kwargs: Any,
    ) -> str:
        """The rendered conversation (continue_final_message: cut before the last `<|im_end|>`)."""
        assert not tokenize
        env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
        text = env.from_string(chat_template or self.chat_template or "").render(
            messages=conversation, tools=tools, add_generation_prompt=add_generation_prompt, **kwargs
        )
        if continue_final_message:
            text = text[: text.rindex("<|im_end|>")]
        return text

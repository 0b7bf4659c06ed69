"""The served model's tokenizer and chat template, through transformers, never from a hub."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from engine.errors import ModelLoadError

logger = logging.getLogger(__name__)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """A fast tokenizer (with `chat_template` when the model has one) for a GGUF file or a Hugging
    Face folder; local files only. Raises ModelLoadError when transformers cannot build it."""
    path = Path(path)
    try:
        if path.suffix == ".gguf":
            # Straight to the fast class: AutoTokenizer would also parse the whole file for a config.
            tokenizer = PreTrainedTokenizerFast.from_pretrained(
                str(path.parent), gguf_file=path.name, local_files_only=True
            )
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer of {path}: {exc}") from exc
    if tokenizer.chat_template is None:
        logger.warning("tokenizer of %s has no chat template; chat requests need one configured", path)
    return tokenizer

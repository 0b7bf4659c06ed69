"""Exceptions of the grammar layer; `api/errors.py` maps each type to an HTTP status."""

from __future__ import annotations


class GrammarError(Exception):
    """Base of every error raised by `constrained/`.

    `message` is safe to show to a client; `param` names the request field at fault
    (the grammar kind, e.g. "json_schema", or "backend"), or None.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidGrammar(GrammarError):
    """The spec cannot be compiled: bad source text or a feature no chosen backend supports.

    The message names the backend(s) and the failing feature, e.g.
    "guidance cannot compile json_schema: Unimplemented keys: [\"if\"]".
    """


class NotComposable(InvalidGrammar):
    """Two constraints that constrained/compose.py cannot join into one grammar.

    `part` says which input is at fault: "answer" (not a JSON format) or "calls" (tool calls
    not written as structural tags).
    """

    def __init__(self, message: str, part: str, param: str | None = None) -> None:
        super().__init__(message, param)
        self.part = part


class UnwritableGrammar(InvalidGrammar):
    """The grammar needs text that no token of the model's vocabulary can write: at its start
    (found when it compiles, `GrammarCompiler`) or after some output (found when the matcher's
    bitmask allows no token, `StructuredOutputManager.allows_any`). SmolLM2's byte-level
    vocabulary, for one, has no token for the bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d and
    0xf1-0xf4 (the lead bytes of code points from U+40000), so a choice of "\x16" cannot be written.
    """


class UnknownGrammarBackend(InvalidGrammar):
    """A backend name that is not in `constrained.registry.GRAMMAR_BACKENDS`; the message lists the names."""


class GrammarCompileTimeout(GrammarError):
    """A compile ran longer than `GrammarConfig.compile_timeout_s` seconds."""


class GrammarConfigError(GrammarError):
    """A `GrammarConfig` or `VocabInfo` built with invalid values (a server setup error, not a client one)."""

"""The two interfaces every grammar library adapter implements: GrammarBackend and Matcher."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from constrained.bitmask import allocate_bitmask, allow_only, allowed_mask, check_bitmask, fill_all_ones
from constrained.spec import GrammarSpec
from constrained.vocab import VocabInfo

if TYPE_CHECKING:
    import torch

# Matcher.is_dead_end tries at most this many allowed tokens before calling a refusal an engine fault.
DEAD_END_TRIES = 256


@dataclass(frozen=True, slots=True, eq=False)
class CompiledGrammar:
    """A backend's compiled artefact for one spec, shared read-only by all matchers of that spec.

    `backend`: the registry name that compiled it ("xgrammar", "guidance"); `artefact` is opaque
    to everyone but that backend; `compile_s`: wall seconds the compile took.
    """

    backend: str
    spec: GrammarSpec
    artefact: Any
    compile_s: float


class Matcher(ABC):
    """Per-sequence grammar state. Not thread-safe: one owner (the engine thread) at a time.

    Token ids are ints in `[0, vocab_size)` of `vocab_info`. An EOS id is accepted only at an
    accepting state and terminates the matcher; afterwards nothing more is accepted and the bitmask
    allows only EOS (`fill_settled_row`). `backend` names the GrammarBackend that made it.
    """

    backend: str = ""

    def __init__(self, vocab_info: VocabInfo) -> None:
        self.vocab_info = vocab_info

    @abstractmethod
    def accept(self, token_ids: Sequence[int]) -> bool:
        """Advance by `token_ids` atomically. Returns False and leaves the state unchanged when any
        token is rejected (including any token after an EOS, or an id out of range)."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]`; the state is unchanged.

        `bitmask`: contiguous int32 CPU `[num_rows, ceil(vocab_size / 32)]`; raises ValueError otherwise.
        """
        if not fill_settled_row(bitmask, row, self):
            self._fill_next(bitmask, row)

    @abstractmethod
    def _fill_next(self, bitmask: torch.Tensor, row: int) -> None:
        """The library's own fill of `bitmask[row]` (already checked) for a matcher with more than
        EOS left."""

    def only_eos_left(self) -> bool:
        """True when the bitmask must allow only EOS: by default once terminated; a backend adds
        states where its library can go no further (guidance: its error state)."""
        return self.is_terminated()

    def is_dead_end(self) -> bool:
        """True when no token can follow: not terminated, not accepting (so EOS is refused), and no
        token the next bitmask allows, EOS aside, is accepted. The grammar needs text the vocabulary
        has no token for (SmolLM2 has none for the byte 0x16), or guidance's matcher is in its error
        state (a bitmask of EOS only). llguidance's bitmask at such a dead end is not empty: it
        allows the token after the missing byte ("0" for "\\x160"), which its matcher then refuses,
        so each allowed token is tried (accept, then rollback) until one is accepted, at most
        `DEAD_END_TRIES` of them (more refusals than that count as not a dead end: an engine fault).
        Costs one bitmask fill and usually one accept; the state is unchanged."""
        if self.is_terminated() or self.is_accepting():
            return False
        size = self.vocab_info.vocab_size
        row = allocate_bitmask(1, size)
        self.fill_bitmask(row, 0)
        allowed = allowed_mask(row, 0, size)
        allowed[list(self.vocab_info.eos_token_ids)] = False
        candidates = np.flatnonzero(allowed)
        for token_id in candidates[:DEAD_END_TRIES].tolist():
            if self.accept([token_id]):
                self.rollback(1)
                return False
        return len(candidates) <= DEAD_END_TRIES

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` accepted tokens (an accepted EOS counts as one).

        Raises ValueError when `num_tokens` is negative or more than were accepted since reset.
        """

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once an EOS token has been accepted (and not rolled back)."""

    @abstractmethod
    def is_accepting(self) -> bool:
        """True when the tokens so far form a complete match, i.e. EOS is allowed now."""

    @abstractmethod
    def forced_tokens(self) -> list[int]:
        """Token ids the grammar forces next (jump-forward); [] when none or when terminated.

        Does not change the state; feed them through `accept()` (and the model) to use them.
        """

    @abstractmethod
    def reset(self) -> None:
        """Return to the initial state, as if no token had been accepted."""


class GrammarBackend(ABC):
    """One grammar library bound to one tokenizer (`VocabInfo`). `compile` is thread-safe."""

    name: str = ""

    def __init__(self, vocab_info: VocabInfo) -> None:
        self.vocab_info = vocab_info

    @abstractmethod
    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile `spec` (slow: milliseconds to seconds). Safe to call from several threads.

        Raises InvalidGrammar, naming this backend and the unsupported feature or source error.
        """

    @abstractmethod
    def new_matcher(self, compiled: CompiledGrammar) -> Matcher:
        """A fresh Matcher at the initial state of `compiled` (cheap).

        Raises ValueError when `compiled` came from another backend.
        """

    def fill_bitmasks(self, matchers: Sequence[tuple[Matcher | None, int]], bitmask: torch.Tensor) -> None:
        """Fill one row per `(matcher, row)` pair (this backend's matchers, or None for a row without
        a grammar): `fill_settled_row` first, the library for the rest (`_fill_live`).

        `bitmask`: contiguous int32 CPU `[num_rows, ceil(vocab_size / 32)]`; raises ValueError otherwise.
        """
        live = [(matcher, row) for matcher, row in matchers if not fill_settled_row(bitmask, row, matcher)]
        if live:
            self._fill_live(live, bitmask)

    def _fill_live(self, matchers: Sequence[tuple[Any, int]], bitmask: torch.Tensor) -> None:
        """The library fill of rows whose matchers have more than EOS left; backends batch it
        (threads, GIL released). Rows are already checked."""
        for matcher, row in matchers:
            matcher._fill_next(bitmask, row)

    def _check_compiled(self, compiled: CompiledGrammar) -> None:
        if compiled.backend != self.name:
            raise ValueError(f"grammar compiled by {compiled.backend!r} given to backend {self.name!r}")


def fill_settled_row(bitmask: torch.Tensor, row: int, matcher: Matcher | None) -> bool:
    """Write `bitmask[row]` when no grammar library is needed for it and return True; else False.

    The one place of the rule for every backend and the engine's mixed batches: a row without a
    matcher (a request with no grammar) allows every token; a matcher with only EOS left
    (`Matcher.only_eos_left`: terminated, or its library failed) allows exactly its EOS ids, so
    the sequence ends instead of sampling from an empty mask. `bitmask`: contiguous int32 CPU
    `[num_rows, ceil(vocab_size / 32)]`; checked for a matcher's vocabulary (ValueError).
    """
    if matcher is None:
        fill_all_ones(bitmask, [row])
        return True
    check_bitmask(bitmask, row, matcher.vocab_info.vocab_size)
    if matcher.only_eos_left():
        allow_only(bitmask, row, matcher.vocab_info.eos_token_ids)
        return True
    return False

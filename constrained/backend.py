"""The two interfaces every grammar library adapter implements: GrammarBackend and Matcher."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from constrained.spec import GrammarSpec
from constrained.vocab import VocabInfo

if TYPE_CHECKING:
    import torch


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

    Token ids are ints in `[0, vocab_size)`. An EOS id is accepted only at an accepting state and
    terminates the matcher; afterwards nothing more is accepted and the bitmask allows only EOS.
    `backend` names the GrammarBackend that made it.
    """

    backend: str = ""

    @abstractmethod
    def accept(self, token_ids: Sequence[int]) -> bool:
        """Advance by `token_ids` atomically. Returns False and leaves the state unchanged when any
        token is rejected (including any token after an EOS, or an id out of range)."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into `bitmask[row]`; the state is unchanged.

        `bitmask`: contiguous int32 CPU `[num_rows, ceil(vocab_size / 32)]`; raises ValueError otherwise.
        """

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

    def fill_bitmasks(self, matchers: Sequence[tuple[Matcher, int]], bitmask: torch.Tensor) -> None:
        """Fill one row per `(matcher, row)` pair of this backend's matchers; backends may parallelise.

        `bitmask`: contiguous int32 CPU `[num_rows, ceil(vocab_size / 32)]`.
        """
        for matcher, row in matchers:
            matcher.fill_bitmask(bitmask, row)

    def _check_compiled(self, compiled: CompiledGrammar) -> None:
        if compiled.backend != self.name:
            raise ValueError(f"grammar compiled by {compiled.backend!r} given to backend {self.name!r}")

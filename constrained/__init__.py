"""Grammar specs, backends (xgrammar, llguidance), composition, compile cache, matchers and bitmasks.

Importing this package never imports xgrammar or llguidance; the registry loads a backend's
module the first time that backend is used.
"""

from constrained.backend import CompiledGrammar, GrammarBackend, Matcher
from constrained.bitmask import allocate_bitmask, allow_only, allowed_token_ids, bitmask_width, fill_all_ones
from constrained.compiler import AUTO_ORDER, CompileStats, GrammarCompiler, GrammarConfig
from constrained.compose import answer_or_calls, tool_calls_grammar
from constrained.errors import (
    GrammarCompileTimeout,
    GrammarConfigError,
    GrammarError,
    InvalidGrammar,
    NotComposable,
    UnknownGrammarBackend,
    UnwritableGrammar,
)
from constrained.registry import GRAMMAR_BACKENDS, get_grammar_backend
from constrained.spec import GrammarKind, GrammarSpec
from constrained.structural_tag import StructuralTag, StructuralTagGrammar, structural_tag_spec
from constrained.vocab import VocabInfo

__all__ = [
    "AUTO_ORDER",
    "GRAMMAR_BACKENDS",
    "CompileStats",
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarCompileTimeout",
    "GrammarCompiler",
    "GrammarConfig",
    "GrammarConfigError",
    "GrammarError",
    "GrammarKind",
    "GrammarSpec",
    "InvalidGrammar",
    "Matcher",
    "NotComposable",
    "StructuralTag",
    "StructuralTagGrammar",
    "UnknownGrammarBackend",
    "UnwritableGrammar",
    "VocabInfo",
    "allocate_bitmask",
    "allow_only",
    "allowed_token_ids",
    "answer_or_calls",
    "bitmask_width",
    "fill_all_ones",
    "get_grammar_backend",
    "structural_tag_spec",
    "tool_calls_grammar",
]

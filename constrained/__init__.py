"""Grammar specs, backends (xgrammar, llguidance), compile cache, matchers and bitmasks."""

from constrained.spec import GrammarKind, GrammarSpec

__all__ = ["GrammarKind", "GrammarSpec"]

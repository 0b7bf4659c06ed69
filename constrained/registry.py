"""The table of grammar backends by name (STYLE §5): imported on first lookup, checked against the base."""

from __future__ import annotations

import importlib

from constrained.backend import GrammarBackend
from constrained.errors import UnknownGrammarBackend

GRAMMAR_BACKENDS: dict[str, str] = {
    "xgrammar": "constrained.xgrammar_backend:XGrammarBackend",
    "guidance": "constrained.guidance_backend:GuidanceBackend",
}


def get_grammar_backend(name: str) -> type[GrammarBackend]:
    """The GrammarBackend class registered as `name`, importing its module (and library) now.

    Raises UnknownGrammarBackend (param="backend") listing the known names; TypeError when the
    table entry is not a GrammarBackend subclass; ImportError when its library is missing.
    """
    target = GRAMMAR_BACKENDS.get(name)
    if target is None:
        known = ", ".join(sorted(GRAMMAR_BACKENDS))
        raise UnknownGrammarBackend(f"unknown grammar backend {name!r}; known: {known}", param="backend")
    module_name, class_name = target.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, GrammarBackend)):
        raise TypeError(f"{target} is not a GrammarBackend subclass")
    return cls

"""Exceptions raised by tool parsers; `api/errors.py` maps each to an HTTP status (all are client errors)."""

from __future__ import annotations


class ToolParserError(ValueError):
    """Base of every error in `toolparsers/`; carries the request field at fault in `param`."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class UnknownToolParser(ToolParserError):
    """`--tool-call-parser` names a parser not in `TOOL_PARSERS`; the message lists the known names."""


class UnknownTool(ToolParserError):
    """A named `tool_choice` names a function that is not among the request's `tools`."""


class InvalidToolChoice(ToolParserError):
    """`tool_choice` is not "none", "auto", "required" or a named function, or is "required" without tools."""


class UnsupportedTool(ToolParserError):
    """A tool cannot be written in the parser's call format (a pythonic call needs an identifier name)."""

"""Chat templates shipped for tool calling (selectable with `--chat-template NAME`)."""

from __future__ import annotations

import pathlib

_FOLDER = pathlib.Path(__file__).resolve().parent


def template_names() -> list[str]:
    """Names of the shipped templates (file stems of `*.jinja` in this folder), sorted."""
    return sorted(path.stem for path in _FOLDER.glob("*.jinja"))


def template_path(name: str) -> pathlib.Path:
    """Path of the shipped Jinja chat template `name` (e.g. "hermes_tools"; ".jinja" optional).

    Raises FileNotFoundError naming the shipped templates when there is none of that name.
    """
    stem = name[: -len(".jinja")] if name.endswith(".jinja") else name
    path = _FOLDER / f"{stem}.jinja"
    if "/" in stem or "\\" in stem or not path.is_file():
        shipped = ", ".join(template_names())
        raise FileNotFoundError(f"no chat template {name!r}; shipped templates: {shipped}")
    return path

"""Early, backend-independent checks of a client's JSON schema: shape against its draft's
meta-schema, and local `$ref`s that point nowhere.

Regular expressions (`pattern`) are left to the grammar backends: their dialect (ECMA-like) is not
Python's, so a Python check would reject patterns the backends accept. Whatever the backend then
cannot compile comes back from the engine as InvalidGrammar, a 400 as well.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import jsonschema
from jsonschema import validators

from api.errors import InvalidRequest


def parse_schema_text(text: str, param: str) -> dict[str, Any]:
    """Decode a schema (or structural tag) sent as JSON text.

    Raises InvalidRequest(param=`param`) unless the text is a JSON object.
    """
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"'{param}' is not valid JSON: {exc}", param=param) from None
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}' must be a JSON object, got {type(schema).__name__}", param=param)
    return schema


def check_json_schema(schema: dict[str, Any], param: str) -> None:
    """Raise InvalidRequest(param=`param`) when `schema` breaks its meta-schema (Draft 2020-12 unless
    `$schema` names another draft) or has a local `$ref` ("#/...") that resolves to nothing.

    The message names the failing keyword and where it is, e.g. "at properties.a.type". Verdicts
    are cached by the schema's canonical JSON text (`_schema_problem`): agents send the same tools
    with every request, and the meta-schema walk costs about 3 ms a tool schema.
    """
    problem = _schema_problem(json.dumps(schema, sort_keys=True))
    if problem is not None:
        raise InvalidRequest(problem, param=param)


@functools.lru_cache(maxsize=1024)
def _schema_problem(text: str) -> str | None:
    """What is wrong with the schema whose JSON text is `text` (`check_json_schema`'s message), or
    None when nothing is."""
    schema = json.loads(text)
    with warnings.catch_warnings():  # an unknown $schema URI warns; the default draft is used
        warnings.simplefilter("ignore")
        validator_class = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        validator_class.check_schema(schema, format_checker=None)
    except jsonschema.SchemaError as exc:
        where = ".".join(str(p) for p in exc.absolute_path) or "the top level"
        return f"invalid JSON schema at {where}: {exc.message}"
    for ref in _local_refs(schema):
        if not _resolves(schema, ref):
            return f"invalid JSON schema: $ref {ref!r} points to nothing"
    return None


def _local_refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            yield ref
        for key, value in node.items():
            if key not in ("enum", "const", "default", "examples"):  # values, not subschemas
                yield from _local_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _local_refs(value)


def _resolves(root: dict[str, Any], ref: str) -> bool:
    """Whether the JSON pointer of `ref` ("#/a/b~1c/0", percent-encoded or not) names a value in `root`."""
    node: Any = root
    for raw in unquote(ref[2:]).split("/") if ref != "#" else []:
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isascii() and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return False
    return True

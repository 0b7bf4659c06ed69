"""Walk a JSON schema: every subschema with its JSON pointer, local `$ref` resolution, `type` sets,
and the shape checks every backend shares (type names, dangling local refs).

Only subschema positions are walked: values of `enum`, `const`, `default`, `examples` and property
names are data, never keywords.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

from constrained.errors import InvalidGrammar

# Keywords whose value is one subschema, a map of name -> subschema, or a list of subschemas.
SUBSCHEMA_ONE = ("additionalProperties", "additionalItems", "items", "contains", "not", "if", "then", "else",
                 "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contentSchema")
SUBSCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
SUBSCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
TYPE_NAMES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
MAX_REF_HOPS = 16


def pointer_join(pointer: str, *parts: str | int) -> str:
    """`pointer` ("#" or "#/a/b") extended by `parts`, each escaped as a JSON pointer token."""
    for part in parts:
        pointer += "/" + str(part).replace("~", "~0").replace("/", "~1")
    return pointer


def iter_subschemas(schema: Any, pointer: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object subschema of `schema` (itself first), depth first, with its JSON pointer.

    Boolean schemas and malformed positions (a number where a subschema belongs) are skipped.
    """
    stack: list[tuple[str, Any]] = [(pointer, schema)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, dict):
            yield where, node
            stack.extend(reversed(_children(where, node, SUBSCHEMA_MAP)))


def iter_reachable(schema: Any, pointer: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """The object subschemas that can apply to an instance, each once: definitions (`$defs`,
    `definitions`) are entered only through the local `$ref`s that use them.

    Falls back to every subschema (iter_subschemas) when some `$ref` is not a local JSON pointer.
    """
    if any(isinstance(node.get("$ref"), str) and not is_local_pointer(node["$ref"])
           for _, node in iter_subschemas(schema, pointer)):
        yield from iter_subschemas(schema, pointer)
        return
    maps = tuple(key for key in SUBSCHEMA_MAP if key not in ("$defs", "definitions"))
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(pointer, schema)]
    while stack:
        where, node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield where, node
        children = _children(where, node, maps)
        ref = node.get("$ref")
        if is_local_pointer(ref):
            try:
                children.append((pointer + ref[1:], resolve_pointer(schema, ref)))
            except KeyError:
                pass  # check_schema_shape reports it
        stack.extend(reversed(children))


def _children(where: str, node: dict[str, Any], maps: tuple[str, ...]) -> list[tuple[str, Any]]:
    children: list[tuple[str, Any]] = []
    for key in SUBSCHEMA_ONE:
        if isinstance(node.get(key), dict):
            children.append((pointer_join(where, key), node[key]))
    for key in maps:
        sub = node.get(key)
        if isinstance(sub, dict):
            children.extend((pointer_join(where, key, name), value) for name, value in sub.items())
    for key in SUBSCHEMA_LIST:
        sub = node.get(key)
        if isinstance(sub, list):
            children.extend((pointer_join(where, key, i), value) for i, value in enumerate(sub))
    return children


def iter_patterns(schema: Any, pointer: str = "#") -> Iterator[tuple[str, str, str]]:
    """Every regular expression of `schema`: (JSON pointer of its node, "pattern" or
    "patternProperties", the regex), in walk order."""
    for where, node in iter_subschemas(schema, pointer):
        if isinstance(node.get("pattern"), str):
            yield where, "pattern", node["pattern"]
        if isinstance(node.get("patternProperties"), dict):
            for regex in node["patternProperties"]:
                yield where, "patternProperties", regex


def is_local_pointer(ref: Any) -> bool:
    """True for "#" and "#/..." refs: JSON pointers into the same document."""
    return isinstance(ref, str) and (ref == "#" or ref.startswith("#/"))


def resolve_pointer(root: Any, ref: str) -> Any:
    """The value `ref` ("#" or "#/a/b", percent- and ~-escaped) points to in `root`.

    Raises KeyError when it points to nothing.
    """
    node = root
    for raw in ref[2:].split("/") if ref != "#" else []:
        token = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isascii() and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise KeyError(ref)
    return node


def deref(root: Any, node: Any) -> Any:
    """`node` with local `$ref`-only hops followed (at most MAX_REF_HOPS); unresolvable refs stay."""
    for _ in range(MAX_REF_HOPS):
        if not (isinstance(node, dict) and is_local_pointer(node.get("$ref"))):
            return node
        try:
            node = resolve_pointer(root, node["$ref"])
        except KeyError:
            return node
    return node


def type_set(node: dict[str, Any]) -> frozenset[str] | None:
    """The names in `node["type"]` (a string or a list), None when the node has no `type`."""
    value = node.get("type")
    if value is None:
        return None
    return frozenset([value] if isinstance(value, str) else value)


def json_type(value: Any) -> str:
    """The JSON Schema type name of a JSON value ("integer" for integral numbers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}[type(value)]


def canonical_value(value: Any) -> str:
    """A JSON value as text that is equal exactly when the values are equal in JSON Schema."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, list):
        return "[" + ",".join(canonical_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{canonical_value(v)}" for k, v in sorted(value.items())) + "}"
    return json.dumps(value)


def changes_base_uri(node: dict[str, Any]) -> bool:
    """True when `node` has an `$id` that is not a plain "#name" anchor and some `$ref` below it (or
    beside it), which then resolves against that `$id` instead of the document root."""
    value = node.get("$id")
    if not isinstance(value, str) or value.startswith("#"):
        return False
    return any("$ref" in sub for _, sub in iter_subschemas(node))


def declared_draft(root: Any) -> str | None:
    """The draft named by the root's `$schema` ("draft-04", "draft-07", "2019-09", ...), else None."""
    uri = root.get("$schema") if isinstance(root, dict) else None
    if isinstance(uri, str):
        for draft in ("draft-03", "draft-04", "draft-06", "draft-07", "2019-09", "2020-12"):
            if draft in uri:
                return draft
    return None


def check_schema_shape(schema: Any, param: str, where: str = "#") -> None:
    """Raise InvalidGrammar (param=`param`) for a `type` that names no JSON type (or an empty list)
    or a local `$ref` that points to nothing; the message names the keyword and its JSON pointer."""
    has_nested_id = False
    refs: list[tuple[str, str]] = []
    for pointer, node in iter_subschemas(schema, where):
        has_nested_id |= node is not schema and changes_base_uri(node)
        value = node.get("type")
        names = [value] if isinstance(value, str) else value
        if value is not None and (not isinstance(names, list) or not names
                                  or not all(isinstance(n, str) and n in TYPE_NAMES for n in names)):
            raise InvalidGrammar(f'invalid JSON schema: "type" at {pointer} is {json.dumps(value)}, '
                                 f"not a JSON type ({', '.join(sorted(TYPE_NAMES))})", param=param)
        if is_local_pointer(node.get("$ref")):
            refs.append((pointer, node["$ref"]))
    if has_nested_id:
        return  # "#/..." then resolves against the nearest $id resource; the backends check it
    for pointer, ref in refs:
        try:
            resolve_pointer(schema, ref)
        except KeyError:
            raise InvalidGrammar(f'invalid JSON schema: "$ref" {ref!r} at {pointer} points to nothing',
                                 param=param) from None

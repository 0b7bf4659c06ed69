"""xgrammar's keyword rules (see the table in constrained/schema_keywords.py): the keywords
xgrammar 0.2.9 enforces only in some positions, found by experiment.

xgrammar compiles a node from one "main" keyword and silently skips others: a `$ref` or the first
of anyOf/oneOf/allOf hides every assertion beside it, an `enum`/`const` hides its siblings, a node
without `type` hides type-specific keywords, and a string takes only one of pattern / format /
lengths. `oneOf` is compiled as `anyOf`, so it is exact only for disjoint branches.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import referencing.exceptions

from constrained.schema_keywords import (
    GUIDANCE_FORMATS,
    NEVER_ENFORCED,
    KeywordRules,
    Unenforced,
    assertions_of,
)
from constrained.schema_walk import (
    canonical_value,
    changes_base_uri,
    declared_draft,
    deref,
    is_local_pointer,
    json_type,
    type_set,
)

XGRAMMAR_FORMATS = GUIDANCE_FORMATS | {"uri-reference", "uri-template", "json-pointer", "relative-json-pointer"}
_BY_TYPE = {
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "object": ("required", "minProperties", "maxProperties", "properties", "patternProperties",
               "additionalProperties"),
    "array": ("items", "prefixItems", "minItems", "maxItems"),
}
_TYPE_SPECIFIC = frozenset(k for keys in _BY_TYPE.values() for k in keys)
# Up to draft-07 the keywords beside a `$ref` are ignored by the specification itself, as by xgrammar.
_REF_HIDES_SIBLINGS = ("draft-03", "draft-04", "draft-06", "draft-07")


def xgrammar_context(node: dict[str, Any], pointer: str, root: Any) -> Iterator[Unenforced]:
    """The position-dependent problems of one `node` at `pointer` of schema `root`."""
    keywords = assertions_of(node)
    if node is not root and changes_base_uri(node):
        yield Unenforced("$id", pointer, "$refs inside resolve against the root document instead")
    if "$ref" in node:
        if not is_local_pointer(node["$ref"]):
            yield Unenforced("$ref", pointer, f"{node['$ref']!r} is not a local JSON pointer")
        if declared_draft(root) not in _REF_HIDES_SIBLINGS:
            yield from _siblings_ignored(node, pointer, keywords, "$ref", root)
        return
    combinators = [k for k in ("anyOf", "oneOf", "allOf") if k in keywords]
    if combinators:
        yield from _siblings_ignored(node, pointer, keywords, combinators[0], root)
        if "allOf" in combinators and len(node["allOf"]) > 1:
            yield Unenforced("allOf", pointer, "only a single branch is enforced")
        if "oneOf" in combinators:
            yield from _overlapping_branches(node["oneOf"], pointer, root)
        return
    if "enum" in keywords or "const" in keywords:
        yield from _enum_breaks_siblings(node, pointer, keywords, root)
        return
    types = type_set(node) or _inferred_type(node)
    if types is None:
        for keyword in keywords:
            if keyword in _TYPE_SPECIFIC:
                yield Unenforced(keyword, pointer, 'ignored without "type"')
        return
    yield from _typed_rules(node, pointer, keywords, types)


def _typed_rules(node: dict[str, Any], pointer: str, keywords: list[str],
                 types: frozenset[str]) -> Iterator[Unenforced]:
    if "multipleOf" in keywords and types & {"integer", "number"}:
        value = node["multipleOf"]
        if "number" in types or not (isinstance(value, (int, float)) and float(value).is_integer()):
            yield Unenforced("multipleOf", pointer, "enforced only on integers, by an integer")
    if "string" in types:
        groups = [[k] for k in ("pattern", "format") if k in keywords]
        lengths = [k for k in ("minLength", "maxLength") if k in keywords]
        groups += [lengths] if lengths else []
        for group in groups[1:]:
            for keyword in group:
                yield Unenforced(keyword, pointer, f'ignored next to "{groups[0][0]}"')
    if "object" in types:
        properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
        required = node.get("required") if isinstance(node.get("required"), list) else []
        missing = [name for name in required if name not in properties]
        if missing:
            yield Unenforced("required", pointer, f'{", ".join(map(str, missing))} not in "properties"')
        if "patternProperties" in keywords and properties:
            yield Unenforced("patternProperties", pointer, 'ignored next to "properties"')


def _inferred_type(node: dict[str, Any]) -> frozenset[str] | None:
    """The type xgrammar gives a node without `type` (only these inferences were verified)."""
    is_object = "properties" in node or "additionalProperties" in node
    is_array = "items" in node or "prefixItems" in node
    if is_object != is_array:
        return frozenset({"object" if is_object else "array"})
    return None


def _siblings_ignored(node: dict[str, Any], pointer: str, keywords: list[str], main: str,
                      root: Any) -> Iterator[Unenforced]:
    """xgrammar compiles only `main` ($ref or the first combinator) and skips the other assertions."""
    for keyword in keywords:
        if keyword != main and not (keyword == "type" and _type_implied(node, main, root)):
            yield Unenforced(keyword, pointer, f'ignored next to "{main}"')


def _type_implied(node: dict[str, Any], main: str, root: Any) -> bool:
    """True when `node["type"]` adds nothing: every branch of `main` is typed within it."""
    outer = _widen(type_set(node) or frozenset())
    branches = [{"$ref": node["$ref"]}] if main == "$ref" else _list(node[main])
    for branch in branches:
        target = deref(root, branch)
        inner = type_set(target) if isinstance(target, dict) else None
        if inner is None or not inner <= outer:
            return False
    return True


def _widen(types: frozenset[str]) -> frozenset[str]:
    return types | {"integer"} if "number" in types else types


def _overlapping_branches(branches: list[Any], pointer: str, root: Any) -> Iterator[Unenforced]:
    for i, first in enumerate(branches):
        for j in range(i + 1, len(branches)):
            if not _disjoint(deref(root, first), deref(root, branches[j]), root):
                yield Unenforced("oneOf", pointer, f"branches {i} and {j} may both match; enforced as anyOf")
                return


def _disjoint(a: Any, b: Any, root: Any) -> bool:
    """True when no instance can match both subschemas (by type, by value, or by a discriminator)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = _types_of(a), _types_of(b)
    if ta is not None and tb is not None and not (_overlap(ta) & _overlap(tb)):
        return True
    va, vb = _values_of(a), _values_of(b)
    if va is not None and vb is not None and not va & vb:
        return True
    if ta != {"object"} or tb != {"object"}:
        return False
    for name in set(_list(a.get("required"))) & set(_list(b.get("required"))):
        pa = deref(root, _dict(a.get("properties")).get(name))
        pb = deref(root, _dict(b.get("properties")).get(name))
        sa = _values_of(pa) if isinstance(pa, dict) else None
        sb = _values_of(pb) if isinstance(pb, dict) else None
        if sa is not None and sb is not None and not sa & sb:
            return True
    return False


def _types_of(node: dict[str, Any]) -> frozenset[str] | None:
    values = _raw_values(node)
    if values is not None:
        return frozenset(json_type(v) for v in values)
    return type_set(node)


def _overlap(types: frozenset[str]) -> frozenset[str]:
    return types | {"integer", "number"} if types & {"integer", "number"} else types


def _raw_values(node: dict[str, Any]) -> list[Any] | None:
    if "const" in node:
        return [node["const"]]
    return node["enum"] if isinstance(node.get("enum"), list) else None


def _values_of(node: dict[str, Any]) -> frozenset[str] | None:
    values = _raw_values(node)
    return None if values is None else frozenset(canonical_value(v) for v in values)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _enum_breaks_siblings(node: dict[str, Any], pointer: str, keywords: list[str],
                          root: Any) -> Iterator[Unenforced]:
    """xgrammar matches only the listed values: each must satisfy the node's other assertions."""
    main = "const" if "const" in keywords else "enum"
    siblings: dict[str, Any] = {k: node[k] for k in keywords if k != main}
    if not siblings:
        return
    if isinstance(root, dict):  # so that "#/$defs/..." refs among the siblings resolve
        siblings.update({k: root[k] for k in ("$defs", "definitions") if k in root})
    validator = jsonschema.Draft202012Validator(siblings, format_checker=jsonschema.FormatChecker())
    for value in _raw_values(node) or []:
        try:
            ok = validator.is_valid(value)
        except (jsonschema.exceptions.SchemaError, jsonschema.exceptions.UnknownType,
                referencing.exceptions.Unresolvable, re.error, LookupError, ValueError, TypeError) as exc:
            reason = f"its values cannot be checked against the keywords next to it ({type(exc).__name__})"
            yield Unenforced(main, pointer, reason)
            return
        if not ok:
            yield Unenforced(main, pointer, f"value {canonical_value(value)[:60]} breaks the keywords next to "
                                            "it, which are ignored")
            return


XGRAMMAR_RULES = KeywordRules("xgrammar", NEVER_ENFORCED, XGRAMMAR_FORMATS, xgrammar_context)

"""Which JSON Schema keywords each grammar backend enforces; InvalidGrammar naming any it would skip.

A backend that compiles a schema while skipping a keyword accepts output the schema rejects
(xgrammar 0.2.9 accepted 53 invalid MaskBench instances that way). So each backend walks the schema
before compiling and refuses it, naming every keyword it would not enforce and where (a JSON
pointer), e.g. `xgrammar cannot enforce json_schema: "patternProperties" at # (ignored next to
"properties")`. The xgrammar rules live in constrained/xgrammar_keywords.py. A schema any backend compiles is then enforced exactly, and "auto" only ever falls
back from one exact constraint to another. Annotations (title, description, default, examples,
$comment, deprecated, readOnly, writeOnly, content*) and unknown keywords never restrict (JSON
Schema ignores them), and so are keywords the schema's declared draft (`$schema`) does not define
(e.g. `propertyNames` in draft-04); vacuous values (`uniqueItems: false`, `dependentRequired: {}`,
`if` without `then`/`else`) are not refused.

Measured by compiling a schema with the keyword and checking that an instance breaking only that
keyword is rejected (xgrammar 0.2.9, llguidance 1.9.1; tests/constrained/test_schema_keywords.py):

| keyword                                  | xgrammar                               | guidance          |
|------------------------------------------|----------------------------------------|-------------------|
| not, uniqueItems, if/then/else, contains, min/maxContains, dependencies, dependent*, propertyNames, unevaluated*, $dynamicRef, $recursiveRef | refused (skipped)  | refused  |
| allOf                                    | one branch only                        | enforced          |
| oneOf                                    | enforced as anyOf: branches must be provably disjoint (type, const/enum, required const discriminator) | llguidance's check |
| assertions next to $ref (2019-09 on), anyOf, oneOf, allOf | refused (skipped)    | enforced          |
| $ref                                     | "#/..." only, no `$id` below the root  | enforced          |
| assertions next to enum/const            | skipped: every value must satisfy them | enforced          |
| type-specific keywords without `type`    | refused unless `properties`/`additionalProperties` or `items`/`prefixItems` imply it | enforced |
| pattern, format, min/maxLength together  | only one of the three                  | enforced          |
| multipleOf                               | integer type and integral value only   | enforced          |
| required                                 | names listed in `properties` only      | enforced          |
| patternProperties                        | only without `properties`              | enforced          |
| format (on strings)                      | xgrammar_keywords.XGRAMMAR_FORMATS     | GUIDANCE_FORMATS  |
| type, enum, const, properties, additionalProperties, items, prefixItems, min/maxItems, min/maxProperties, min/maxLength, pattern, minimum, maximum, exclusiveMinimum/Maximum | enforced | enforced |

llguidance refuses its gaps itself (and reads `$schema`); the guidance rules restate them so that the
message names each keyword's JSON pointer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from constrained.errors import InvalidGrammar
from constrained.schema_walk import check_schema_shape, declared_draft, iter_reachable, pointer_join, type_set

ASSERTIONS = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "maxItems", "minItems", "uniqueItems", "maxContains",
    "minContains", "maxProperties", "minProperties", "required", "dependentRequired", "dependencies",
    "properties", "patternProperties", "additionalProperties", "propertyNames", "items", "prefixItems",
    "additionalItems", "contains", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf",
    "not", "if", "then", "else", "dependentSchemas", "$ref", "$dynamicRef", "$recursiveRef",
})
NEVER_ENFORCED = frozenset({
    "not", "uniqueItems", "if", "then", "else", "contains", "minContains", "maxContains", "dependencies",
    "dependentRequired", "dependentSchemas", "propertyNames", "unevaluatedProperties", "unevaluatedItems",
    "$dynamicRef", "$recursiveRef",
})
# Keywords of NEVER_ENFORCED that an older draft does not define: there they are annotations.
_NEWER_THAN_DRAFT_07 = frozenset({"minContains", "maxContains", "dependentRequired", "dependentSchemas",
                                  "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"})
_NEWER_THAN_DRAFT_06 = _NEWER_THAN_DRAFT_07 | {"if", "then", "else"}
_NEWER_THAN_DRAFT_04 = _NEWER_THAN_DRAFT_06 | {"propertyNames", "contains"}
NOT_IN_DRAFT = {"draft-03": _NEWER_THAN_DRAFT_04, "draft-04": _NEWER_THAN_DRAFT_04, "draft-06": _NEWER_THAN_DRAFT_06,
                "draft-07": _NEWER_THAN_DRAFT_07, "2019-09": frozenset({"$dynamicRef"})}
GUIDANCE_FORMATS = frozenset({"email", "date", "time", "date-time", "duration", "uuid", "ipv4", "ipv6",
                              "hostname", "uri"})
_EMPTY_IS_VACUOUS = frozenset({"dependencies", "dependentRequired", "dependentSchemas", "patternProperties",
                               "properties", "required", "allOf"})
_TRUE_IS_VACUOUS = frozenset({"propertyNames", "unevaluatedProperties", "unevaluatedItems",
                              "additionalProperties", "additionalItems", "items"})
MAX_LISTED = 8
_NOT_IMPLEMENTED = "not implemented"


@dataclass(frozen=True, slots=True)
class Unenforced:
    """One keyword a backend would not enforce: where it is (JSON pointer) and why."""

    keyword: str
    pointer: str
    reason: str

    def __str__(self) -> str:
        return f'"{self.keyword}" at {self.pointer} ({self.reason})'


ContextRule = Callable[[dict[str, Any], str, Any], Iterator[Unenforced]]


@dataclass(frozen=True, slots=True)
class KeywordRules:
    """What one backend enforces: keywords it never enforces, the `format`s it implements, and
    `context`, the rules for keywords it enforces only in some positions (node, pointer, root)."""

    backend: str
    refused: frozenset[str]
    formats: frozenset[str]
    context: ContextRule | None = None


def is_vacuous(keyword: str, node: dict[str, Any]) -> bool:
    """True when `node[keyword]` cannot reject any instance (e.g. `uniqueItems: false`)."""
    value = node[keyword]
    if keyword in _EMPTY_IS_VACUOUS and value in ({}, []):
        return True
    if keyword in _TRUE_IS_VACUOUS and (value is True or value == {}):
        return True
    if keyword == "uniqueItems":
        return value is False
    if keyword in ("minLength", "minItems", "minProperties"):
        return value == 0
    if keyword == "if":
        return "then" not in node and "else" not in node
    if keyword in ("then", "else"):
        return "if" not in node
    if keyword in ("minContains", "maxContains"):
        return "contains" not in node
    return False


def assertions_of(node: dict[str, Any]) -> list[str]:
    """The keywords of `node` that can reject an instance (known, not vacuous), in node order."""
    return [k for k in node if k in ASSERTIONS and not is_vacuous(k, node)]


def find_unenforced(schema: Any, rules: KeywordRules, where: str = "#") -> list[Unenforced]:
    """Every keyword of `schema` reachable from its root that `rules.backend` would not enforce."""
    found: dict[tuple[str, str], Unenforced] = {}
    undefined = NOT_IN_DRAFT.get(declared_draft(schema) or "", frozenset())
    refused = rules.refused - undefined
    inert: list[str] = []  # subschemas that never apply: of vacuous or undefined keywords
    for pointer, node in iter_reachable(schema, where):
        if any(pointer == p or pointer.startswith(p + "/") for p in inert):
            continue
        inert += [pointer_join(pointer, k) for k in node
                  if k in undefined or (k in ASSERTIONS and is_vacuous(k, node))]
        keywords = assertions_of(node)
        problems = [Unenforced(k, pointer, _NOT_IMPLEMENTED) for k in keywords if k in refused]
        fmt = node.get("format")
        types = type_set(node)
        if "format" in keywords and (types is None or "string" in types) and not (
                isinstance(fmt, str) and fmt in rules.formats):
            problems.append(Unenforced("format", pointer, f"format {json.dumps(fmt)} is not implemented"))
        if rules.context is not None:
            problems.extend(rules.context(node, pointer, schema))
        for problem in problems:
            found.setdefault((problem.keyword, problem.pointer), problem)
    # Position rules are not reported inside a keyword refused already (e.g. the branches of "allOf").
    inside = [pointer_join(p.pointer, p.keyword) for p in found.values()]
    return [p for p in found.values() if p.reason == _NOT_IMPLEMENTED
            or not any(p.pointer == r or p.pointer.startswith(r + "/") for r in inside)]


def check_keywords(schema: Any, rules: KeywordRules, param: str, where: str = "#") -> None:
    """Raise InvalidGrammar (param=`param`) when `schema` is malformed (check_schema_shape) or uses a
    keyword `rules.backend` would not enforce; the message lists each keyword with its JSON pointer."""
    check_schema_shape(schema, param, where)
    problems = find_unenforced(schema, rules, where)
    if problems:
        listed = "; ".join(str(p) for p in problems[:MAX_LISTED])
        more = f"; and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
        raise InvalidGrammar(f"{rules.backend} cannot enforce {param}: {listed}{more}", param=param)


GUIDANCE_RULES = KeywordRules("guidance", NEVER_ENFORCED, GUIDANCE_FORMATS)

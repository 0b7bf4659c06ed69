"""JSON-text checks for the acceptance-case e2e tests: the longest whitespace run outside strings,
and whether a (possibly truncated) JSON text is still a prefix of a document valid against a schema."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

_WS = " \t\n\r"


def longest_whitespace_run_outside_strings(text: str) -> int:
    """The longest run of JSON whitespace outside string literals."""
    best = run = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string, run = True, 0
        elif ch in _WS:
            run += 1
            best = max(best, run)
        else:
            run = 0
    return best


@dataclass
class _Node:
    kind: str                     # object, array, string, number, literal
    complete: bool
    text: str = ""                # string value so far / number or literal text
    items: list[_Node] = field(default_factory=list)
    members: list[tuple[str, bool, _Node | None]] = field(default_factory=list)  # key, key complete, value

    def value(self) -> Any:
        if self.kind == "object":
            return {k: v.value() for k, _, v in self.members if v is not None}
        if self.kind == "array":
            return [item.value() for item in self.items]
        if self.kind == "string":
            return self.text
        return json.loads(self.text)


class _PrefixError(ValueError):
    pass


_NUMBER_PREFIX = re.compile(r"-?(?:0|[1-9][0-9]*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class _PrefixParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def at_end(self) -> bool:
        return self.pos >= len(self.text)

    def skip_ws(self) -> None:
        while not self.at_end() and self.text[self.pos] in _WS:
            self.pos += 1

    def fail(self, what: str) -> None:
        raise _PrefixError(f"{what} at offset {self.pos}: {self.text[max(0, self.pos - 20):self.pos + 20]!r}")

    def value(self) -> _Node:
        ch = self.text[self.pos]
        if ch == "{":
            return self.obj()
        if ch == "[":
            return self.arr()
        if ch == '"':
            text, complete = self.string()
            return _Node("string", complete, text)
        if ch == "-" or ch.isdigit():
            return self.number()
        return self.literal()

    def obj(self) -> _Node:
        node = _Node("object", False)
        if self.container_starts(node, "}"):
            return node
        while True:
            if self.text[self.pos] != '"':
                self.fail("expected a key")
            key, key_complete = self.string()
            if not key_complete:
                node.members.append((key, False, None))
                return node
            self.skip_ws()
            if self.at_end():
                node.members.append((key, True, None))
                return node
            if self.text[self.pos] != ":":
                self.fail("expected ':'")
            self.pos += 1
            self.skip_ws()
            if self.at_end():
                node.members.append((key, True, None))
                return node
            child = self.value()
            node.members.append((key, True, child))
            if not child.complete or self.container_ends(node, "}"):
                return node

    def arr(self) -> _Node:
        node = _Node("array", False)
        if self.container_starts(node, "]"):
            return node
        while True:
            child = self.value()
            node.items.append(child)
            if not child.complete or self.container_ends(node, "]"):
                return node

    def container_starts(self, node: _Node, close: str) -> bool:
        """At the opening bracket of `node`: step past it; True when `node` ends at once, empty
        (`close` next: node.complete) or cut by the end of the text, else at its first member."""
        self.pos += 1
        self.skip_ws()
        if self.at_end():
            return True
        if self.text[self.pos] == close:
            self.pos += 1
            node.complete = True
            return True
        return False

    def container_ends(self, node: _Node, close: str) -> bool:
        """After a complete member or item: True when `node` ends here, closed by `close`
        (node.complete) or cut by the end of the text (also right after a ","); False at the next
        member."""
        self.skip_ws()
        if self.at_end():
            return True
        ch = self.text[self.pos]
        self.pos += 1
        if ch == close:
            node.complete = True
            return True
        if ch != ",":
            self.fail(f"expected ',' or '{close}'")
        self.skip_ws()
        return self.at_end()

    def string(self) -> tuple[str, bool]:
        self.pos += 1
        out = []
        while not self.at_end():
            ch = self.text[self.pos]
            if ch == '"':
                self.pos += 1
                return "".join(out), True
            if ch == "\\":
                rest = self.text[self.pos + 1:self.pos + 6]
                if not rest:
                    self.pos = len(self.text)
                    break
                if rest[0] in _ESCAPES:
                    out.append(_ESCAPES[rest[0]])
                    self.pos += 2
                    continue
                if rest[0] != "u":
                    self.fail("bad escape")
                digits = rest[1:5]
                if not all(c in "0123456789abcdefABCDEF" for c in digits):
                    self.fail("bad \\u escape")
                if len(digits) < 4:
                    self.pos = len(self.text)
                    break
                out.append(chr(int(digits, 16)))
                self.pos += 6
                continue
            if ord(ch) < 0x20:
                self.fail("control character in a string")
            out.append(ch)
            self.pos += 1
        return "".join(out), False

    def number(self) -> _Node:
        match = _NUMBER_PREFIX.match(self.text, self.pos)
        assert match is not None
        text = match.group(0)
        self.pos = match.end()
        if self.at_end():
            return _Node("number", False, text)
        if not _NUMBER.fullmatch(text):
            self.fail(f"bad number {text!r}")
        return _Node("number", True, text)

    def literal(self) -> _Node:
        rest = self.text[self.pos:self.pos + 5]
        for word in ("true", "false", "null"):
            if rest.startswith(word):
                self.pos += len(word)
                return _Node("literal", True, word)
            if self.pos + len(rest) == len(self.text) and word.startswith(rest):
                self.pos = len(self.text)
                return _Node("literal", False, rest)
        self.fail("unexpected character")
        raise AssertionError  # unreachable


_KIND_TYPES = {"object": {"object"}, "array": {"array"}, "string": {"string"}, "number": {"number", "integer"}}


def _node_types(node: _Node) -> set[str]:
    if node.kind == "literal":
        word = node.text
        return {"null"} if "null".startswith(word) and word[:1] == "n" else {"boolean"}
    return _KIND_TYPES[node.kind]


def _partial_problems(node: _Node, schema: Any, path: str) -> list[str]:
    if schema is True or schema == {}:
        return []
    if schema is False:
        return [f"{path}: no value is allowed here"]
    if node.complete:
        validator = jsonschema.Draft202012Validator(schema)
        return [f"{path} {e.json_path}: {e.message}" for e in validator.iter_errors(node.value())]
    problems = []
    types = schema.get("type")
    if types is not None:
        allowed = {types} if isinstance(types, str) else set(types)
        if not (_node_types(node) & allowed):
            problems.append(f"{path}: a {node.kind} where the schema wants {types}")
    if "enum" in schema and node.kind == "string" and \
            not any(isinstance(v, str) and v.startswith(node.text) for v in schema["enum"]):
        problems.append(f"{path}: {node.text!r} starts no enum value")
    if node.kind == "string" and isinstance(schema.get("maxLength"), int) and len(node.text) > schema["maxLength"]:
        problems.append(f"{path}: string longer than maxLength {schema['maxLength']} already")
    if node.kind == "array":
        if isinstance(schema.get("maxItems"), int) and len(node.items) > schema["maxItems"]:
            problems.append(f"{path}: more than maxItems {schema['maxItems']} items already")
        item_schema = schema.get("items", True)
        for i, item in enumerate(node.items):
            problems += _partial_problems(item, item_schema, f"{path}/{i}")
    if node.kind == "object":
        properties = schema.get("properties") or {}
        patterns = schema.get("patternProperties") or {}
        extra = schema.get("additionalProperties", True)
        for key, key_complete, child in node.members:
            if not key_complete:
                if extra is False and not patterns and not any(name.startswith(key) for name in properties):
                    problems.append(f"{path}: key prefix {key!r} starts no allowed property")
                continue
            sub: Any
            if key in properties:
                sub = properties[key]
            elif any(re.search(p, key) for p in patterns):
                sub = next(patterns[p] for p in patterns if re.search(p, key))
            else:
                sub = extra
                if extra is False:
                    problems.append(f"{path}: property {key!r} is not allowed")
                    continue
            if child is not None:
                problems += _partial_problems(child, sub, f"{path}/{key}")
    return problems


def json_prefix_problems(text: str, schema: dict[str, Any]) -> list[str]:
    """Why `text` is not a prefix of a JSON document valid against `schema` ([] when it is).

    Complete values are validated with a Draft 2020-12 validator; the open (last) value of each
    container is checked as far as it goes: its type, allowed keys (a partial key must start an
    allowed property name), maxLength / maxItems / enum so far. Supports the schema keywords the
    cases use (type, properties, required, additionalProperties, patternProperties, items,
    min/maxItems, min/maxLength, enum and whatever the validator checks on complete values).
    """
    parser = _PrefixParser(text)
    try:
        parser.skip_ws()
        if parser.at_end():
            return []
        node = parser.value()
        parser.skip_ws()
        if not parser.at_end():
            parser.fail("text after the JSON document")
    except _PrefixError as exc:
        return [f"not a JSON prefix: {exc}"]
    return _partial_problems(node, schema, "#")

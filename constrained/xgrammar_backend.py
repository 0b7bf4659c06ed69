"""GrammarBackend over xgrammar: the only module that imports xgrammar."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import xgrammar as xgr

from constrained.backend import CompiledGrammar, GrammarBackend, Matcher
from constrained.bitmask import allowed_token_ids, bitmask_width
from constrained.errors import InvalidGrammar
from constrained.schema_keywords import check_keywords
from constrained.regex_features import find_lookaround
from constrained.schema_walk import iter_patterns
from constrained.source import is_ebnf, load_choices, load_schema
from constrained.spec import FIXED_LAYOUT_SEPARATORS, MAX_JSON_WHITESPACE, GrammarKind, GrammarSpec
from constrained.structural_tag import ANSWER_POINTER, StructuralTag, parse_structural_tag, schema_pointer
from constrained.vocab import VocabInfo
from constrained.xgrammar_keywords import XGRAMMAR_RULES

logger = logging.getLogger(__name__)

# xgrammar threads per compile (token-mask cache); the GrammarCompiler pool adds compile-level parallelism.
_COMPILE_THREADS = 2
_LOG_PREFIX = re.compile(r"^\[[\d:.]+\] \S+?:\d+: ")
_CHECK_FAILED = re.compile(r"Check failed: \(.*?\) is false: ")
_MAX_MESSAGE_CHARS = 500
# Most tokens `XGrammarMatcher._forced_tail` adds past xgrammar's own jump-forward tokens.
_MAX_TAIL_TOKENS = 8


def _library_message(exc: Exception) -> str:
    """xgrammar's error text without its C++ log prefix, first line, bounded length."""
    text = _CHECK_FAILED.sub("", _LOG_PREFIX.sub("", str(exc).strip()))
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0][:_MAX_MESSAGE_CHARS] if lines else type(exc).__name__


def _ebnf_literal(text: str) -> str:
    """`text` as an xgrammar EBNF string literal (JSON escapes, non-ASCII kept)."""
    return json.dumps(text, ensure_ascii=False)


def _bad_pattern(schema: Any, where: str) -> str:
    """'pattern "..." at #/...: <error>' for the first regex of `schema` xgrammar cannot parse, else ""."""
    for pointer, keyword, regex in iter_patterns(schema, where):
        try:
            xgr.Grammar.from_regex(regex)
        except (RuntimeError, ValueError) as exc:
            return f"{keyword} {json.dumps(regex, ensure_ascii=False)} at {pointer}: {_library_message(exc)}"
    return ""


def _refuse_lookaround(schema: Any, spec: GrammarSpec, where: str) -> None:
    """Raise InvalidGrammar naming the first `pattern` / `patternProperties` regex of `schema` with
    lookaround, which xgrammar would silently drop (constrained/regex_features.py)."""
    for pointer, keyword, regex in iter_patterns(schema, where):
        at = find_lookaround(regex)
        if at is not None:
            raise InvalidGrammar(
                f"xgrammar cannot compile {spec.kind.value}: {keyword} {json.dumps(regex, ensure_ascii=False)} at "
                f"{pointer}: lookaround at offset {at} is not supported (xgrammar would drop the assertion)",
                param=spec.kind.value)


def _check_schema(schema: Any, spec: GrammarSpec, where: str) -> None:
    """Refuse (InvalidGrammar) a schema at JSON pointer `where` with a keyword or regex feature
    xgrammar would not enforce."""
    check_keywords(schema, XGRAMMAR_RULES, spec.kind.value, where)
    _refuse_lookaround(schema, spec, where)


def _decoded_vocab(tokenizer_info: Any) -> list[bytes]:
    """Each token id's bytes, equal to `xgr.TokenizerInfo.decoded_vocab`, read in one FFI call.

    The public property (and slices of the FFI array behind it) fetch each of the 49,152 tokens
    with FFI calls that give up the GIL: with another thread busy in Python (an engine stepping
    while the first grammar compiles) each retake waits for the switch interval, and the read took
    over 20 s. `serialize_json` is one call (~0.07 s); xgrammar writes each byte of a token there as
    the code point of the same value (U+0000-U+00FF), so latin-1 gives the bytes back. Should a
    later xgrammar write anything else, the property is read instead (slow under contention, never
    wrong).
    """
    serialized = json.loads(tokenizer_info.serialize_json())
    try:
        return [text.encode("latin-1") for text in serialized["decoded_vocab"]]
    except (KeyError, TypeError, UnicodeEncodeError):
        logger.warning("xgrammar's serialized tokenizer info has another layout; reading decoded_vocab per token")
        return [bytes(token) for token in tokenizer_info.decoded_vocab]


class XGrammarBackend(GrammarBackend):
    """xgrammar adapter: EBNF and Lark grammars, JSON schema, regex, choice, structural tags.

    Construction reads the tokenizer's vocabulary (~0.5 s). `compile` is thread-safe. JSON object
    properties must appear in the schema's order (xgrammar's default, as in vLLM). A schema with a
    keyword xgrammar would skip (`not`, `uniqueItems`, `patternProperties` next to `properties`, ...;
    see constrained/xgrammar_keywords.py) is refused with InvalidGrammar, never weakened.
    """

    name = "xgrammar"

    def __init__(self, vocab_info: VocabInfo) -> None:
        super().__init__(vocab_info)
        self._tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            vocab_info.tokenizer, vocab_size=vocab_info.vocab_size, stop_token_ids=list(vocab_info.eos_token_ids)
        )
        # Our GrammarCompiler caches by spec; xgrammar's own cache would hold a second copy.
        # Dynamic compilation builds token-mask cache entries on first use instead of up front.
        # On MaskBench (2 shared CPUs) eager compiles had p99 ~25 s (39-schema subset); dynamic ones
        # p99 ~0.2 s over all 385, for first-use fills of up to ~36 ms (p99), paid once per grammar
        # state and shared by later requests of the same compiled grammar.
        self._compiler = xgr.GrammarCompiler(
            self._tokenizer_info, max_threads=_COMPILE_THREADS, cache_enabled=False, enable_dynamic_compilation=True
        )
        self._batch = xgr.BatchGrammarMatcher()
        self._decoded_vocab = _decoded_vocab(self._tokenizer_info)
        self._compilers: dict[GrammarKind, Callable[[GrammarSpec], Any]] = {
            GrammarKind.JSON_SCHEMA: self._compile_json,
            GrammarKind.JSON_OBJECT: self._compile_json,
            GrammarKind.REGEX: self._compile_regex,
            GrammarKind.CHOICE: self._compile_choice,
            GrammarKind.GRAMMAR: self._compile_grammar,
            GrammarKind.STRUCTURAL_TAG: self._compile_structural_tag,
        }

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile `spec` with xgrammar. Raises InvalidGrammar("xgrammar cannot compile <kind>: ...")."""
        start = time.perf_counter()
        try:
            artefact = self._compilers[spec.kind](spec)
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:
            raise InvalidGrammar(
                f"xgrammar cannot compile {spec.kind.value}: {_library_message(exc)}", param=spec.kind.value
            ) from exc
        return CompiledGrammar(self.name, spec, artefact, time.perf_counter() - start)

    def new_matcher(self, compiled: CompiledGrammar) -> Matcher:
        """A fresh XGrammarMatcher. Raises ValueError for a grammar of another backend."""
        self._check_compiled(compiled)
        return XGrammarMatcher(xgr.GrammarMatcher(compiled.artefact), self.vocab_info, self._decoded_vocab)

    def _fill_live(self, matchers: Sequence[tuple[Any, int]], bitmask: torch.Tensor) -> None:
        """Fill the rows of live XGrammarMatchers at once (xgrammar's threaded batch fill, GIL released)."""
        assert all(isinstance(matcher, XGrammarMatcher) for matcher, _ in matchers)
        self._batch.batch_fill_next_token_bitmask([m.xgr_matcher for m, _ in matchers], bitmask,
                                                  [row for _, row in matchers])

    def _json_options(self, spec: GrammarSpec, fixed_layout: bool = False) -> dict[str, Any]:
        """xgrammar's JSON-schema options for `spec` (a structural tag's `fixed_layout` content:
        no free whitespace, FIXED_LAYOUT_SEPARATORS)."""
        if fixed_layout:
            return {"any_whitespace": False, "strict_mode": not spec.additional_properties,
                    "separators": FIXED_LAYOUT_SEPARATORS}
        options: dict[str, Any] = {"any_whitespace": spec.any_whitespace, "strict_mode": not spec.additional_properties}
        if spec.any_whitespace:
            options["max_whitespace_cnt"] = MAX_JSON_WHITESPACE
        else:
            options["separators"] = (",", ":")  # compact, like guidance; xgrammar's default would add spaces
        return options

    def _compile_regex(self, spec: GrammarSpec) -> Any:
        at = find_lookaround(spec.source)
        if at is not None:
            raise InvalidGrammar(f"xgrammar cannot compile regex: lookaround at offset {at} is not supported "
                                 "(xgrammar would drop the assertion)", param=spec.kind.value)
        return self._compiler.compile_regex(spec.source)

    def _compile_json(self, spec: GrammarSpec) -> Any:
        schema = load_schema(spec)
        _check_schema(schema, spec, "#")
        text = json.dumps(schema, ensure_ascii=False)
        return self._with_pattern_detail(lambda: self._compiler.compile_json_schema(text, **self._json_options(spec)),
                                         schema, spec, "#")

    def _schema_grammar(self, schema: Any, spec: GrammarSpec, where: str, fixed_layout: bool) -> Any:
        """`xgr.Grammar` of a checked schema (for structural tags)."""
        text = json.dumps(schema, ensure_ascii=False)
        options = self._json_options(spec, fixed_layout)
        return self._with_pattern_detail(lambda: xgr.Grammar.from_json_schema(text, **options),
                                         schema, spec, where)

    @staticmethod
    def _with_pattern_detail(build: Callable[[], Any], schema: Any, spec: GrammarSpec, where: str) -> Any:
        """`build()`; on failure InvalidGrammar naming the bad regex and its JSON pointer when there is one."""
        try:
            return build()
        except (RuntimeError, ValueError) as exc:
            detail = _bad_pattern(schema, where) or _library_message(exc)
            raise InvalidGrammar(f"xgrammar cannot compile {spec.kind.value}: {detail}",
                                 param=spec.kind.value) from exc

    def _compile_choice(self, spec: GrammarSpec) -> Any:
        choices = load_choices(spec)
        return self._compiler.compile_grammar("root ::= " + " | ".join(_ebnf_literal(c) for c in choices))

    def _compile_grammar(self, spec: GrammarSpec) -> Any:
        if is_ebnf(spec.source):
            return self._compiler.compile_grammar(spec.source)
        return self._compiler.compile_lark(spec.source)

    def _compile_structural_tag(self, spec: GrammarSpec) -> Any:
        """Forced: xgrammar `tags_with_separator` (at least one), or with an answer `or` of the
        answer's JSON and those calls; otherwise `triggered_tags`."""
        parsed = parse_structural_tag(spec)
        tags = [self._tag(i, tag, spec) for i, tag in enumerate(parsed.tags)]
        fmt: dict[str, Any]
        if parsed.forced:
            fmt = {"type": "tags_with_separator", "tags": tags, "separator": parsed.separator,
                   "at_least_one": True, "stop_after_first": parsed.stop_after_first}
            if parsed.answer is not None:
                answer = self._json_content(parsed.answer, spec, ANSWER_POINTER)
                fmt = {"type": "or", "elements": [answer, fmt]}
        else:
            fmt = {"type": "triggered_tags", "triggers": list(parsed.triggers), "tags": tags,
                   "at_least_one": False, "stop_after_first": parsed.stop_after_first}
        structural_tag = {"type": "structural_tag", "format": fmt}
        return self._compiler.compile_structural_tag(json.dumps(structural_tag, ensure_ascii=False))

    def _tag(self, index: int, tag: StructuralTag, spec: GrammarSpec) -> dict[str, Any]:
        content: dict[str, Any]
        if tag.style == "json":
            content = self._json_content(tag.schema, spec, schema_pointer(index), tag.fixed_layout)
        else:
            _check_schema(tag.schema, spec, schema_pointer(index))
            content = {"type": "json_schema", "json_schema": tag.schema, "style": tag.style}
        return {"type": "tag", "begin": tag.begin, "end": tag.end, "content": content}

    def _json_content(self, schema: Any, spec: GrammarSpec, where: str,
                      fixed_layout: bool = False) -> dict[str, Any]:
        """A structural-tag format for JSON matching `schema` (at JSON pointer `where` in the source),
        through EBNF so that any_whitespace (or `fixed_layout`) and additional_properties hold there too."""
        _check_schema(schema, spec, where)
        return {"type": "grammar", "grammar": str(self._schema_grammar(schema, spec, where, fixed_layout))}


class XGrammarMatcher(Matcher):
    """Matcher over one `xgrammar.GrammarMatcher`; see `Matcher` for the contract."""

    backend = "xgrammar"

    def __init__(self, matcher: Any, vocab_info: VocabInfo, decoded_vocab: list[bytes]) -> None:
        """`decoded_vocab`: each token id's bytes (xgrammar's TokenizerInfo.decoded_vocab)."""
        super().__init__(vocab_info)
        self.xgr_matcher = matcher
        self._vocab_size = vocab_info.vocab_size
        self._decoded_vocab = decoded_vocab
        self._scratch: torch.Tensor | None = None   # one bitmask row for _forced_tail
        self._num_tokens = 0

    def accept(self, token_ids: Sequence[int]) -> bool:
        """Accept all of `token_ids` or none (rolls back a partial prefix). Returns False on rejection."""
        for i, token_id in enumerate(token_ids):
            if not 0 <= token_id < self._vocab_size or not self.xgr_matcher.accept_token(token_id):
                if i:
                    self.xgr_matcher.rollback(i)
                return False
        self._num_tokens += len(token_ids)
        return True

    def _fill_next(self, bitmask: torch.Tensor, row: int) -> None:
        """xgrammar's fill of `bitmask[row]` (int32 CPU `[num_rows, ceil(V/32)]`, checked)."""
        self.xgr_matcher.fill_next_token_bitmask(bitmask, row)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` tokens. Raises ValueError beyond what was accepted."""
        if not 0 <= num_tokens <= self._num_tokens:
            raise ValueError(f"cannot roll back {num_tokens} of {self._num_tokens} accepted tokens")
        if num_tokens:
            self.xgr_matcher.rollback(num_tokens)
            self._num_tokens -= num_tokens

    def is_terminated(self) -> bool:
        """True once EOS was accepted."""
        return bool(self.xgr_matcher.is_terminated())

    def is_accepting(self) -> bool:
        """True when EOS is allowed now (complete match, not yet terminated)."""
        return not self.is_terminated() and bool(self.xgr_matcher.is_completed())

    def forced_tokens(self) -> list[int]:
        """Jump-forward token ids: xgrammar's find_jump_forward_tokens, then the tokens it leaves
        out at the end of the forced string where the grammar allows nothing else (`_forced_tail`);
        [] when terminated."""
        if self.is_terminated():
            return []
        tokens = [int(t) for t in self.xgr_matcher.find_jump_forward_tokens()]
        return tokens + self._forced_tail(tokens)

    def _forced_tail(self, tokens: list[int]) -> list[int]:
        """The forced tokens after `tokens` that find_jump_forward_tokens leaves out.

        xgrammar drops the forced string's last token whenever it is a strict prefix of a longer
        vocabulary token, even one the grammar forbids next: ` "` before a tool's name (SmolLM2 has
        ` ""`) then costs a decode step. While the grammar allows only tokens that are prefixes of
        the rest of the forced string, every continuation writes that rest, so the longest of them
        is taken (then xgrammar's jump-forward again), at most _MAX_TAIL_TOKENS. Measures with
        accept and rollback: the state is unchanged on return.
        """
        if not self.accept(tokens):
            return []
        tail: list[int] = []
        try:
            while len(tail) < _MAX_TAIL_TOKENS:
                token_id = self._only_prefix_token(self.xgr_matcher.find_jump_forward_string().encode())
                if token_id is None or not self.accept([token_id]):
                    break
                more = [int(t) for t in self.xgr_matcher.find_jump_forward_tokens()]
                tail.append(token_id)
                if more and self.accept(more):
                    tail += more
        finally:
            self.rollback(len(tokens) + len(tail))
        return tail

    def _only_prefix_token(self, rest: bytes) -> int | None:
        """The longest allowed next token when every allowed next token is a non-empty prefix of
        `rest` (the forced bytes still to write); None when `rest` is empty or one is not."""
        if not rest:
            return None
        if self._scratch is None:
            self._scratch = torch.empty((1, bitmask_width(self._vocab_size)), dtype=torch.int32)
        self.xgr_matcher.fill_next_token_bitmask(self._scratch, 0)
        allowed = allowed_token_ids(self._scratch, 0, self._vocab_size)
        vocab = self._decoded_vocab
        if not allowed or any(t >= len(vocab) or not vocab[t] or not rest.startswith(vocab[t])
                              for t in allowed):
            return None
        return max(allowed, key=lambda t: len(vocab[t]))

    def reset(self) -> None:
        """Back to the initial state."""
        self.xgr_matcher.reset()
        self._num_tokens = 0

"""GrammarBackend over llguidance: the only module that imports llguidance."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import llguidance
import llguidance.hf
import torch

from constrained.backend import CompiledGrammar, GrammarBackend, Matcher
from constrained.errors import InvalidGrammar
from constrained.json_start import json_start_chars
from constrained.schema_keywords import GUIDANCE_RULES, check_keywords
from constrained.schema_walk import iter_patterns
from constrained.source import load_choices, load_schema
from constrained.spec import GrammarKind, GrammarSpec, guidance_json_options
from constrained.structural_tag import (
    ANSWER_POINTER,
    StructuralTag,
    StructuralTagGrammar,
    parse_structural_tag,
    schema_pointer,
)
from constrained.vocab import VocabInfo

logger = logging.getLogger(__name__)
_MAX_MESSAGE_CHARS = 500
_ANY_TEXT = "TAG_ANY: /(?s:.*)/"


def _library_message(text: str) -> str:
    """llguidance's error text on one line, without the parser-state dump, bounded length."""
    text = text.split("<state>")[0]
    return " ".join(line.strip() for line in text.splitlines() if line.strip())[:_MAX_MESSAGE_CHARS]


def _lark_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _bad_pattern(spec: GrammarSpec) -> str:
    """'pattern "..." at #/...: <error>' for the first regex of a JSON spec llguidance cannot parse, else ""."""
    if spec.kind == GrammarKind.JSON_SCHEMA:
        schemas = [("#", load_schema(spec))]
    elif spec.kind == GrammarKind.STRUCTURAL_TAG:
        parsed = parse_structural_tag(spec)
        schemas = [(schema_pointer(i), tag.schema) for i, tag in enumerate(parsed.tags)]
        if parsed.answer is not None:
            schemas.append((ANSWER_POINTER, parsed.answer))
    else:
        return ""
    for where, schema in schemas:
        for pointer, keyword, regex in iter_patterns(schema, where):
            error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_regex(regex))
            if error:
                detail = error.split("regex parse error:")[-1]
                return f"{keyword} {json.dumps(regex, ensure_ascii=False)} at {pointer}: {_library_message(detail)}"
    return ""


class GuidanceBackend(GrammarBackend):
    """llguidance adapter: Lark (and GBNF/EBNF converted to Lark), JSON schema, regex, choice,
    structural tags (style "json" only). Construction reads the tokenizer (~1 s). `compile` is
    thread-safe. A schema with a keyword llguidance does not enforce is refused (InvalidGrammar
    naming each keyword and its JSON pointer; see constrained/schema_keywords.py).

    The compiled artefact is a template `LLMatcher` that never consumes tokens; matchers are deep copies.
    """

    name = "guidance"

    def __init__(self, vocab_info: VocabInfo) -> None:
        super().__init__(vocab_info)
        self._tokenizer = llguidance.hf.from_tokenizer(
            vocab_info.tokenizer, n_vocab=vocab_info.vocab_size, eos_token=list(vocab_info.eos_token_ids)
        )
        self._executor = llguidance.LLExecutor()
        self._builders: dict[GrammarKind, Callable[[GrammarSpec], str]] = {
            GrammarKind.JSON_SCHEMA: self._json_grammar,
            GrammarKind.JSON_OBJECT: self._json_grammar,
            GrammarKind.REGEX: lambda spec: llguidance.LLMatcher.grammar_from_regex(spec.source),
            GrammarKind.CHOICE: self._choice_grammar,
            GrammarKind.GRAMMAR: lambda spec: llguidance.grammar_from("grammar", spec.source),
            GrammarKind.STRUCTURAL_TAG: self._structural_tag_grammar,
        }

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile `spec` with llguidance. Raises InvalidGrammar("guidance cannot compile <kind>: ...")."""
        start = time.perf_counter()
        try:
            grammar = self._builders[spec.kind](spec)
        except (ValueError, TypeError, KeyError) as exc:
            raise InvalidGrammar(
                f"guidance cannot compile {spec.kind.value}: {_library_message(str(exc))}", param=spec.kind.value
            ) from exc
        template = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if template.is_error():
            error = template.get_error()
            detail = (_bad_pattern(spec) if "regex" in error else "") or _library_message(error)
            raise InvalidGrammar(f"guidance cannot compile {spec.kind.value}: {detail}", param=spec.kind.value)
        return CompiledGrammar(self.name, spec, template, time.perf_counter() - start)

    def new_matcher(self, compiled: CompiledGrammar) -> Matcher:
        """A fresh GuidanceMatcher (deep copy of the template). Raises ValueError for another backend's grammar."""
        self._check_compiled(compiled)
        return GuidanceMatcher(compiled.artefact.deep_copy(), self.vocab_info)

    def _fill_live(self, matchers: Sequence[tuple[Any, int]], bitmask: torch.Tensor) -> None:
        """Fill the rows of live GuidanceMatchers in parallel (llguidance's executor, GIL released)."""
        assert all(isinstance(matcher, GuidanceMatcher) for matcher, _ in matchers)
        _check_bitmask(bitmask)
        num_rows, num_words = bitmask.shape
        self._executor.unsafe_compute_mask_ptr([(m.ll_matcher, row) for m, row in matchers], bitmask.data_ptr(),
                                               num_words * 4, num_rows)

    def _json_options(self, spec: GrammarSpec, fixed_layout: bool = False) -> Any:
        """llguidance's JsonCompileOptions for `spec` (constrained.spec.guidance_json_options)."""
        return guidance_json_options(spec.any_whitespace, fixed_layout)

    def _json_grammar(self, spec: GrammarSpec) -> str:
        schema = load_schema(spec)
        check_keywords(schema, GUIDANCE_RULES, spec.kind.value)
        # llguidance refuses a bare `true` ("expecting object schema"); {} means the same.
        text = json.dumps({} if schema is True else schema, ensure_ascii=False)
        return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=self._json_options(spec))

    def _choice_grammar(self, spec: GrammarSpec) -> str:
        choices = load_choices(spec)
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(_lark_literal(c) for c in choices))

    def _structural_tag_grammar(self, spec: GrammarSpec) -> str:
        """Lark for a structural tag (see constrained/structural_tag.py for the semantics).

        Forced: `calls: call (SEPARATOR call)*` (or one call), no free text, and `start: calls`, or
        `start: answer | calls` with `answer: %json{answer schema}`. Otherwise free text is TAG_TEXT,
        any text that contains no trigger, so a trigger can only start a call: `start: tag* TAG_TEXT`
        where each tag is `TAG_TEXT trigger rest-of-begin %json{schema} end` (with stop_after_first:
        `start: TAG_TEXT | tag`). A trigger that is a special token of the tokenizer (`<...>`) is
        matched as that token. Raises InvalidGrammar for style "qwen_xml", and for an answer that
        may start with the first character of a call's `begin` (`_refuse_answer_like_calls`).
        """
        parsed: StructuralTagGrammar = parse_structural_tag(spec)
        _refuse_answer_like_calls(parsed, spec)
        names = [f"tag_{i}" for i in range(len(parsed.tags))]
        lines = ["%llguidance {}", f"call: {' | '.join(names)}"]
        for i, (name, tag) in enumerate(zip(names, parsed.tags)):
            lines += self._tag_rules(i, name, tag, parsed, spec)
        if parsed.forced:
            more = "" if parsed.stop_after_first else " (SEPARATOR call)*" if parsed.separator else " call*"
            lines.append(f"calls: call{more}")
            if parsed.separator and not parsed.stop_after_first:
                lines.append(f"SEPARATOR: {_lark_literal(parsed.separator)}")
            if parsed.answer is None:
                lines.append("start: calls")
            else:
                answer = self._json_rule(parsed.answer, spec, ANSWER_POINTER, "the answer")
                lines += ["start: answer | calls", f"answer: {answer}"]
        else:
            lines.append("start: TAG_TEXT | call" if parsed.stop_after_first else "start: call* TAG_TEXT")
            triggers = " | ".join(_lark_literal(t) for t in parsed.triggers)
            lines += [_ANY_TEXT, f"TAG_TRIGGER: {triggers}", "TAG_TEXT: TAG_ANY & ~(TAG_ANY TAG_TRIGGER TAG_ANY)"]
        return llguidance.LLMatcher.grammar_from_lark("\n".join(lines) + "\n")

    def _tag_rules(self, index: int, name: str, tag: StructuralTag, parsed: StructuralTagGrammar,
                   spec: GrammarSpec) -> list[str]:
        if tag.style != "json":
            raise InvalidGrammar(f'guidance cannot compile structural_tag: style "{tag.style}" of structures[{index}] '
                                 "is not supported", param=spec.kind.value)
        trigger = parsed.trigger_of(tag)
        rest = tag.begin[len(trigger):]
        rules = []
        if trigger in self.vocab_info.special_token_texts and trigger.startswith("<") and trigger.endswith(">"):
            head = trigger if parsed.forced else f"TAG_TEXT {trigger}"
        elif parsed.forced:
            head, rest = "", tag.begin
        else:  # one lexeme: text without a trigger, then the trigger (so the trigger ends the text)
            head = f"{name.upper()}_HEAD"
            rules.append(f"{head}: TAG_TEXT {_lark_literal(trigger)}")
        content = self._json_rule(tag.schema, spec, schema_pointer(index), f"structures[{index}]",
                                  tag.fixed_layout)
        body = [head, _lark_literal(rest) if rest else "", content, _lark_literal(tag.end) if tag.end else ""]
        rules.append(f"{name}: " + " ".join(x for x in body if x))
        return rules

    def _json_rule(self, schema: dict[str, Any] | bool, spec: GrammarSpec, where: str, what: str,
                   fixed_layout: bool = False) -> str:
        """`%json {...}` for a structural tag's embedded schema at JSON pointer `where` (`what` names
        it in errors), checked and with the spec's whitespace options (or the fixed layout's).
        Raises InvalidGrammar for an unenforced keyword or a `false` schema."""
        check_keywords(schema, GUIDANCE_RULES, spec.kind.value, where)
        if schema is False:
            raise InvalidGrammar(f"guidance cannot compile structural_tag: the schema of {what} is "
                                 "false (nothing matches)", param=spec.kind.value)
        body: dict[str, Any] = schema if isinstance(schema, dict) else {}
        options = self._json_options(spec, fixed_layout)
        body = {**body, "x-guidance": {**body.get("x-guidance", {}), **options}}
        return "%json " + json.dumps(body, ensure_ascii=False)


def _refuse_answer_like_calls(parsed: StructuralTagGrammar, spec: GrammarSpec) -> None:
    """Raise InvalidGrammar when a call's `begin` starts with a character the answer's JSON may start
    with: llguidance drops the `%json` answer once the literal begin matches the same text (llama3_json
    calls `{"name": ...` beside an object answer), so it would refuse valid answers."""
    if parsed.answer is None:
        return
    starts = json_start_chars(parsed.answer)
    for index, tag in enumerate(parsed.tags):
        if not tag.begin or tag.begin[0] in starts:
            raise InvalidGrammar(
                f"guidance cannot compile structural_tag: structures[{index}].begin {tag.begin!r} starts "
                "like the JSON answer beside it, which llguidance cannot tell apart", param=spec.kind.value)


class GuidanceMatcher(Matcher):
    """Matcher over one `llguidance.LLMatcher`; see `Matcher` for the contract.

    EOS is never fed to llguidance (which counts it inconsistently for rollback); this class
    checks `is_accepting()` and records termination itself.
    """

    backend = "guidance"

    def __init__(self, matcher: Any, vocab_info: VocabInfo) -> None:
        super().__init__(vocab_info)
        self.ll_matcher = matcher
        self._vocab_size = vocab_info.vocab_size
        self._eos_token_ids = frozenset(vocab_info.eos_token_ids)
        self._num_tokens = 0
        self._terminated = False

    def accept(self, token_ids: Sequence[int]) -> bool:
        """Accept all of `token_ids` or none. Returns False on rejection, state unchanged."""
        ids = list(token_ids)
        if not ids:
            return True
        if self._terminated:
            return False
        ends_with_eos = ids[-1] in self._eos_token_ids
        body = ids[:-1] if ends_with_eos else ids
        if any(t in self._eos_token_ids or not 0 <= t < self._vocab_size for t in body):
            return False
        if body:
            consumed = self.ll_matcher.try_consume_tokens(body)
            if consumed < len(body):
                if consumed:
                    self.ll_matcher.rollback(consumed)
                return False
        if ends_with_eos:
            if not self.ll_matcher.is_accepting():
                if body:
                    self.ll_matcher.rollback(len(body))
                return False
            self._terminated = True
        self._num_tokens += len(ids)
        return True

    def _fill_next(self, bitmask: torch.Tensor, row: int) -> None:
        """llguidance's fill of `bitmask[row]` (int32 CPU `[num_rows, ceil(V/32)]`, checked)."""
        _check_bitmask(bitmask)
        self.ll_matcher.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), bitmask.shape[1] * 4)

    def rollback(self, num_tokens: int) -> None:
        """Undo the last `num_tokens` tokens (EOS included). Raises ValueError beyond what was accepted."""
        if not 0 <= num_tokens <= self._num_tokens:
            raise ValueError(f"cannot roll back {num_tokens} of {self._num_tokens} accepted tokens")
        real = num_tokens
        if self._terminated and num_tokens:
            self._terminated = False
            real -= 1
        if real:
            self.ll_matcher.rollback(real)
        self._num_tokens -= num_tokens

    def is_terminated(self) -> bool:
        """True once EOS was accepted."""
        return self._terminated

    def only_eos_left(self) -> bool:
        """True when the bitmask must allow only EOS: terminated, or llguidance hit an internal limit
        (its error state; logged) so that the sequence ends instead of sampling from an empty mask
        (`constrained.backend.fill_settled_row`)."""
        if self._terminated:
            return True
        if self.ll_matcher.is_error():
            logger.warning("llguidance matcher failed: %s", _library_message(self.ll_matcher.get_error()))
            return True
        return False

    def is_accepting(self) -> bool:
        """True when EOS is allowed now (complete match, not yet terminated)."""
        return not self._terminated and bool(self.ll_matcher.is_accepting())

    def forced_tokens(self) -> list[int]:
        """Fast-forward token ids (llguidance's compute_ff_tokens); [] when terminated."""
        if self._terminated:
            return []
        return [int(t) for t in self.ll_matcher.compute_ff_tokens()]

    def reset(self) -> None:
        """Back to the initial state."""
        self.ll_matcher.reset()
        self._num_tokens = 0
        self._terminated = False


def _check_bitmask(bitmask: torch.Tensor) -> None:
    """The layout llguidance writes through a raw pointer: int32, CPU, `[num_rows, ceil(V/32)]`,
    contiguous (the checks `llguidance.torch` makes). That module is not imported: its import
    runs `torch.compile` on a helper we never call, about 1 s of CPU per process. Raises ValueError."""
    if bitmask.dtype != torch.int32 or bitmask.device.type != "cpu" or bitmask.dim() != 2 \
            or not bitmask.is_contiguous():
        raise ValueError(f"bitmask must be a contiguous 2-D int32 CPU tensor, got {bitmask.dtype} "
                         f"{tuple(bitmask.shape)} on {bitmask.device}")

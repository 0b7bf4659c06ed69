"""GrammarCompiler: compiles GrammarSpecs off the step loop, caches results (failures too), makes matchers."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from constrained.backend import CompiledGrammar, GrammarBackend, Matcher, fill_settled_row
from constrained.errors import GrammarCompileTimeout, GrammarConfigError, InvalidGrammar, UnwritableGrammar
from constrained.registry import GRAMMAR_BACKENDS, get_grammar_backend
from constrained.schema_walk import check_schema_shape
from constrained.source import canonical_source, load_schema
from constrained.spec import GrammarKind, GrammarSpec
from constrained.structural_tag import parse_structural_tag
from constrained.vocab import VocabInfo

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

AUTO_ORDER: tuple[str, ...] = ("guidance", "xgrammar")
"""Backends tried, in order, for `default_backend="auto"`: the first that compiles wins.

Every backend refuses (InvalidGrammar) a schema with a keyword it would not enforce
(constrained/schema_keywords.py), so a fallback only ever yields another exact constraint, and when
all refuse the message names each backend's keywords. Measured on the MaskBench sample (385
schemas, 1065 instances, SmolLM2 tokenizer; benchmarks/grammar_bench.py, tests/constrained/
test_maskbench.py), no backend accepts an invalid instance of a schema it compiled:
- guidance compiles 303/385 (refusing `not`, `uniqueItems`, `dependencies`, unknown `format`s,
  ambiguous `oneOf`, ...): 910/1065 instances = 85.45%, all of the loss from refusals.
- xgrammar compiles 278/385: it skips more keywords (`allOf`, assertions next to `anyOf`/`oneOf`,
  `patternProperties` next to `properties`, ...), so it refuses more: 837/1065 = 78.6%.
- guidance first, xgrammar on refusal: 85.45% (no schema guidance refuses is exact on xgrammar in
  this sample; xgrammar adds e.g. format "uri-reference" and structural tags of style qwen_xml).
  guidance also compiles faster (p50 1.9 ms vs 2.4 ms, p99 40 ms vs 47 ms on 2 shared CPUs,
  keyword check included) and its per-token fill has no first-use spikes (p50 28 us vs 27 us,
  p99 0.6 ms vs 27 ms).
"""

CacheKey = tuple[str, str, str, bool, bool]


@dataclass(frozen=True, slots=True)
class GrammarConfig:
    """Grammar settings from the CLI.

    `default_backend`: "auto" (see AUTO_ORDER) or a registry name; used when a spec names none.
    `compile_timeout_s`: wall seconds one compile may run before its future fails with
    GrammarCompileTimeout (a backend's one-time build, on first use, is not counted). `max_workers`: compile threads. `max_cache_entries`: LRU bound.
    Raises GrammarConfigError on invalid values.
    """

    default_backend: str = "auto"
    compile_timeout_s: float = 30.0
    max_workers: int = 2
    max_cache_entries: int = 1024

    def __post_init__(self) -> None:
        if self.default_backend != "auto" and self.default_backend not in GRAMMAR_BACKENDS:
            known = ", ".join(["auto", *sorted(GRAMMAR_BACKENDS)])
            raise GrammarConfigError(f"unknown grammar backend {self.default_backend!r}; known: {known}",
                                     param="default_backend")
        if self.compile_timeout_s <= 0:
            raise GrammarConfigError("compile_timeout_s must be > 0", param="compile_timeout_s")
        if self.max_workers < 1 or self.max_cache_entries < 1:
            raise GrammarConfigError("max_workers and max_cache_entries must be >= 1", param="max_workers")


@dataclass(frozen=True, slots=True)
class CompileStats:
    """Counters since construction. `compile_s_sum` / `num_compiles`: per backend attempt, seconds."""

    cache_hits: int
    cache_misses: int
    num_compiles: int
    num_failures: int
    num_timeouts: int
    compile_s_sum: float
    compile_s_max: float


class GrammarCompiler:
    """Compile cache and matcher factory for one tokenizer; thread-safe.

    Specs compile on a small ThreadPoolExecutor; results and failures are cached by
    (backend choice, kind, canonical source, any_whitespace, additional_properties), LRU-bounded.
    `backends` injects prebuilt backend instances by name (tests); others are built from the
    registry on first use (~1 s each: they read the vocabulary).
    """

    def __init__(self, vocab_info: VocabInfo, config: GrammarConfig | None = None,
                 backends: Mapping[str, GrammarBackend] | None = None) -> None:
        self.vocab_info = vocab_info
        self.config = config or GrammarConfig()
        self._backends: dict[str, GrammarBackend] = dict(backends or {})
        self._backend_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cache: OrderedDict[CacheKey, Future[CompiledGrammar]] = OrderedDict()
        self._pool = ThreadPoolExecutor(self.config.max_workers, thread_name_prefix="grammar-compile")
        self._counts = {"hits": 0, "misses": 0, "compiles": 0, "failures": 0, "timeouts": 0}
        self._compile_s_sum = 0.0
        self._compile_s_max = 0.0

    def get_backend(self, name: str) -> GrammarBackend:
        """The backend instance for `name`, built on first use (~1 s). Raises UnknownGrammarBackend."""
        backend = self._backends.get(name)  # lock-free once built: the engine thread calls this per step
        if backend is not None:
            return backend
        with self._backend_lock:
            backend = self._backends.get(name)
            if backend is None:
                backend = get_grammar_backend(name)(self.vocab_info)
                self._backends[name] = backend
            return backend

    def warm_up(self) -> None:
        """Build now every backend the configured default can use, so no request pays for it."""
        choice = self.config.default_backend
        for name in AUTO_ORDER if choice == "auto" else (choice,):
            self.get_backend(name)

    def submit(self, spec: GrammarSpec) -> Future[CompiledGrammar]:
        """Start (or reuse) the compile of `spec`; never blocks on compilation.

        The future's result is a CompiledGrammar; its exception is InvalidGrammar (both backends
        refused, or bad source; message names the feature), UnknownGrammarBackend, or
        GrammarCompileTimeout. Failures stay cached like successes.
        """
        choice = spec.backend or self.config.default_backend
        error: InvalidGrammar | None = None
        try:
            source = canonical_source(spec)
        except InvalidGrammar as exc:
            source, error = spec.source, exc
        key: CacheKey = (choice, spec.kind.value, source, spec.any_whitespace, spec.additional_properties)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self._counts["hits"] += 1
                return cached
            self._counts["misses"] += 1
            future: Future[CompiledGrammar] = Future()
            self._cache[key] = future
            while len(self._cache) > self.config.max_cache_entries:
                self._cache.popitem(last=False)
        if error is not None:
            self._count("failures")
            self._settle(future, None, error)
        else:
            inner = self._pool.submit(self._compile_timed, spec, choice, future)
            inner.add_done_callback(partial(self._finish, key, future))
        return future

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Blocking `submit(spec).result()`; raises what the future would."""
        return self.submit(spec).result()

    def new_matcher(self, compiled: CompiledGrammar) -> Matcher:
        """A fresh Matcher from the backend that compiled `compiled`."""
        return self.get_backend(compiled.backend).new_matcher(compiled)

    def fill_bitmasks(self, matchers: Sequence[tuple[Matcher | None, int]], bitmask: torch.Tensor) -> None:
        """Fill `bitmask[row]` for every `(matcher, row)`, batched per backend (parallel, GIL released).

        A None matcher (a request without a grammar in a mixed batch) allows every token
        (`constrained.backend.fill_settled_row`). `bitmask`: contiguous int32 CPU
        `[num_rows, ceil(vocab_size / 32)]`; rows not listed are untouched.
        """
        groups: dict[str, list[tuple[Matcher | None, int]]] = {}
        for matcher, row in matchers:
            if matcher is None:
                fill_settled_row(bitmask, row, None)
            else:   # the backend settles finished matchers' rows itself
                groups.setdefault(matcher.backend, []).append((matcher, row))
        for name, pairs in groups.items():
            self.get_backend(name).fill_bitmasks(pairs, bitmask)

    def stats(self) -> CompileStats:
        """A snapshot of the cache and compile counters."""
        with self._lock:
            c = self._counts
            return CompileStats(c["hits"], c["misses"], c["compiles"], c["failures"], c["timeouts"],
                                self._compile_s_sum, self._compile_s_max)

    def close(self) -> None:
        """Stop the compile threads; queued compiles are cancelled, running ones finish unobserved."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile_timed(self, spec: GrammarSpec, choice: str, future: Future[CompiledGrammar]) -> CompiledGrammar:
        # The timer starts when a worker picks the spec up and the backends are built: it bounds
        # compile time, not queueing, nor a backend's one-time build (reading the vocabulary: ~1 s,
        # far more on a slow or busy machine; a server builds them at start-up, `warm_up`).
        for name in AUTO_ORDER if choice == "auto" else (choice,):
            self.get_backend(name)
        timer = threading.Timer(self.config.compile_timeout_s, self._expire, (spec, future))
        timer.daemon = True
        timer.start()
        try:
            return self._compile_with_fallback(spec, choice)
        finally:
            timer.cancel()

    def _compile_with_fallback(self, spec: GrammarSpec, choice: str) -> CompiledGrammar:
        names = AUTO_ORDER if choice == "auto" else (choice,)
        _check_source(spec)  # a malformed source fails once, not once per backend
        errors: list[InvalidGrammar] = []
        for name in names:
            backend = self.get_backend(name)
            start = time.perf_counter()
            try:
                compiled = backend.compile(spec)
            except InvalidGrammar as exc:
                errors.append(exc)
            else:
                self._check_writable(spec, compiled)
                return compiled
            finally:
                self._record_compile(time.perf_counter() - start)
        if len(errors) == 1:
            raise errors[0]
        detail = "; ".join(e.message for e in errors)
        raise InvalidGrammar(f"no grammar backend can compile {spec.kind.value}: {detail}", param=spec.kind.value)

    def _check_writable(self, spec: GrammarSpec, compiled: CompiledGrammar) -> None:
        """Raise UnwritableGrammar when a fresh matcher of `compiled` is at a dead end
        (`Matcher.is_dead_end`), at its start or after the tokens its grammar forces there: the output's
        first characters are ones the vocabulary cannot write, so the request would sample from an
        empty mask. A forced run the matcher itself refuses counts too (llguidance forces the token
        after a byte the vocabulary lacks). One matcher and up to two bitmask fills."""
        matcher = self.new_matcher(compiled)
        forced = matcher.forced_tokens()   # a dead end after a forced run ("a\x16") is found here too
        if matcher.is_dead_end() or (forced and (not matcher.accept(forced) or matcher.is_dead_end())):
            raise UnwritableGrammar(
                f"the {spec.kind.value} cannot be written by this model: no token of its vocabulary can begin "
                "the output it requires (it needs characters the tokenizer has no token for)", param=spec.kind.value)

    def _record_compile(self, seconds: float) -> None:
        with self._lock:
            self._counts["compiles"] += 1
            self._compile_s_sum += seconds
            self._compile_s_max = max(self._compile_s_max, seconds)

    def _expire(self, spec: GrammarSpec, future: Future[CompiledGrammar]) -> None:
        timeout = GrammarCompileTimeout(
            f"compiling {spec.kind.value} took longer than {self.config.compile_timeout_s:g} s", param=spec.kind.value
        )
        if self._settle(future, None, timeout):
            self._count("timeouts")

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _finish(self, key: CacheKey, future: Future[CompiledGrammar], inner: Future[CompiledGrammar]) -> None:
        error = inner.exception()
        result = None if error is not None else inner.result()
        if error is not None:
            self._count("failures")
            if not isinstance(error, InvalidGrammar):
                logger.error("grammar compile crashed: %r", error, exc_info=error)
        if self._settle(future, result, error):
            return
        # Timed out earlier: later submits of this key get the real outcome instead of the timeout.
        late: Future[CompiledGrammar] = Future()
        self._settle(late, result, error)
        with self._lock:
            if self._cache.get(key) is future:
                self._cache[key] = late

    def _settle(self, future: Future[CompiledGrammar], result: CompiledGrammar | None,
                error: BaseException | None) -> bool:
        """Complete `future` once; False when it was already completed (e.g. by the timeout)."""
        try:
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]
        except InvalidStateError:
            return False
        return True


def _check_source(spec: GrammarSpec) -> None:
    """Raise InvalidGrammar for a malformed JSON schema or structural tag, whatever the backend."""
    if spec.kind == GrammarKind.JSON_SCHEMA:
        check_schema_shape(load_schema(spec), spec.kind.value)
    elif spec.kind == GrammarKind.STRUCTURAL_TAG:
        parse_structural_tag(spec)

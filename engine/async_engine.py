"""AsyncEngine: the engine step loop on its own thread, with an asyncio-facing generate()."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from engine.config import EngineConfig
from engine.errors import EngineDeadError, EngineOverloaded, EngineStepError, RequestTimedOut
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest, RequestOutput
from engine.request_deadlines import RequestDeadlines
from engine.stats import EngineStats
from engine.step_threads import plan_step_threads
from engine.threads import configure_threads, release_openmp_threads
from lora.registry import LoraAdapterInfo

T = TypeVar("T")

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3   # steps failing in a row before the engine declares itself dead
_IDLE_WAIT_S = 0.5             # longest sleep of an idle engine thread between inbox checks


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput]


class AsyncEngine:
    """Runs LLMEngine.step() in a loop on a dedicated thread; requests come in and outputs go
    out through thread-safe queues (`loop.call_soon_threadsafe`), one asyncio.Queue per request.

    A consumer that stops iterating `generate()` (disconnect, cancellation) aborts its request
    and the engine frees its blocks before the next step. If a step raises, the requests in it
    fail with EngineStepError and the engine goes on; after `max_consecutive_failures` failing
    steps in a row, or when the thread ends for any reason, `is_healthy()` turns False and every
    request still waiting for output (in the engine, in the inbox, or submitted later) fails at
    once with EngineDeadError. Requests past `config.request_timeout_s` are aborted with
    RequestTimedOut.
    """

    def __init__(self, engine: LLMEngine, model_name: str, model_path: str,
                 max_consecutive_failures: int = MAX_CONSECUTIVE_FAILURES) -> None:
        self.engine = engine
        engine.set_grammar_ready_callback(self._wake)
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.model_path = model_path
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.arch.vocab_size
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._dead: EngineDeadError | None = None      # set once, under _lock, when the thread ends
        self._stopping = False
        self._max_consecutive_failures = max_consecutive_failures
        # Admission: requests submitted minus those the engine thread has added = still in the inbox.
        # Each counter has one writer (event loop / engine thread); both are read under _lock.
        self._num_submitted = 0
        self._num_added = 0
        self._deadlines = RequestDeadlines(engine.config.request_timeout_s)
        self._thread = threading.Thread(target=self._run, name="structserve-engine", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, config: EngineConfig) -> AsyncEngine:
        """Load the model named by `config` and start the engine thread (blocking, seconds).

        Raises engine.errors.ModelLoadError when the model cannot be loaded.
        """
        from engine.model_loader import load_model

        device = _pick_device(config.device)
        dtype = _pick_dtype(config.dtype, device)
        num_threads = configure_threads(config.num_threads) if device.type == "cpu" else None
        # ^ before the load: it measures the weight formats' crossover
        loaded = load_model(config.model, dtype=dtype, device=device, max_model_len=config.max_model_len,
                            quantization=config.quantization, crossover_rows=config.crossover_rows,
                            int4_kernel=config.int4_kernel)
        max_model_len = loaded.max_model_len
        step_threads = (plan_step_threads(num_threads, explicit=config.num_threads is not None,
                                          leave_api_core=config.leave_api_core)
                        if num_threads is not None else None)
        torch.manual_seed(config.seed)
        engine = LLMEngine(config, loaded.model, loaded.arch, loaded.tokenizer, device, dtype, max_model_len,
                           step_threads=step_threads)
        engine.warm_up_grammars()
        logger.info("serving %s: dtype=%s, %.1fM parameters, KV cache %d blocks x %d tokens (%d tokens), "
                    "max_model_len %d", loaded.name, str(dtype).removeprefix("torch."), loaded.num_params / 1e6,
                    engine.runner.num_blocks, config.block_size, engine.runner.num_blocks * config.block_size,
                    max_model_len)
        # this thread's torch work is done: its OpenMP pool would slow every region of the engine thread's
        release_openmp_threads()
        return cls(engine, config.served_model_name or loaded.name, loaded.path)

    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters and gauges (engine/stats.py)."""
        return self.engine.stats()

    def is_healthy(self) -> bool:
        """False once the engine thread has died or shut down."""
        return self._dead is None and self._thread.is_alive()

    def num_waiting(self) -> int:
        """Requests submitted and not yet running: still in the inbox, or waiting in the scheduler
        (queued, compiling their grammar, or preempted). Any thread."""
        with self._lock:
            in_inbox = self._num_submitted - self._num_added
        return in_inbox + self.engine.stats().num_requests_waiting

    def check_admission(self) -> None:
        """Return when a new request may be submitted now; any thread, no side effects.

        Raises EngineDeadError when the engine is not running, EngineOverloaded when
        `config.max_waiting_requests` requests are already waiting (see `num_waiting`).
        """
        if not self.is_healthy():
            raise EngineDeadError("the engine is not running")
        limit = self.engine.config.max_waiting_requests
        num_waiting = self.num_waiting()
        if num_waiting >= limit:
            raise EngineOverloaded(
                f"the server is overloaded: {num_waiting} requests are waiting (limit {limit}); retry later")

    def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Check `request` now and return the stream of its outputs until the last (finished=True);
        the request is queued when that stream is first iterated.

        Raises at once, having queued nothing: EngineDeadError when the engine is not running,
        EngineOverloaded when too many requests wait (`check_admission`), ContextLengthExceeded /
        InvalidSamplingParams / LoraAdapterNotFound for a request that cannot run
        (`LLMEngine.validate`), so the requests of a batch are all checked before any is queued.
        The stream raises EngineDeadError before its first output when the engine died meanwhile,
        and later EngineStepError, RequestTimedOut, EngineDeadError or an error of the request's
        grammar compile; the request is finished and its blocks are free by then.
        """
        self.check_admission()
        self.engine.validate(request)
        return self._outputs(request)

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        """Raise InvalidSamplingParams(param) for an id outside the model's vocabulary (the check
        `generate` runs on a request's ids, for ids that arrive without one: /detokenize)."""
        self.engine.limits.check_token_ids(token_ids, param)

    async def _outputs(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            # Checked under the lock the dying thread takes to fail every stream: a request is
            # either failed by it or refused here, never left waiting.
            if self._dead is not None:
                raise EngineDeadError(self._dead.message)
            self._streams[request.request_id] = stream
            self._num_submitted += 1
        self._inbox.put(("add", request))
        finished = False
        try:
            while True:
                out = await stream.queue.get()
                if out.error is not None:
                    finished = True
                    raise out.error
                yield out
                if out.finished:
                    finished = True
                    return
        finally:
            with self._lock:
                self._streams.pop(request.request_id, None)
            if not finished:
                self._inbox.put(("abort", request.request_id))

    @property
    def lora_enabled(self) -> bool:
        """True when the engine serves LoRA adapters (--enable-lora)."""
        return self.engine.lora_enabled

    def lora_adapters(self) -> list[LoraAdapterInfo]:
        """The loaded LoRA adapters in load order (empty when LoRA is off); any thread."""
        return self.engine.lora_adapters()

    async def load_lora_adapter(self, name: str, path: str, replace: bool = False) -> LoraAdapterInfo:
        """Read and validate the PEFT folder `path` in a worker thread and serve it as `name`.
        Raises LoraNotEnabled, InvalidLoraAdapter, LoraAdapterExists (unless `replace`)."""
        return await asyncio.to_thread(_released_after, self.engine.load_lora_adapter, name, path, replace)

    async def unload_lora_adapter(self, name: str) -> None:
        """Stop accepting `name` at once; returns when no request uses it any more (running ones
        finish on its weights). Raises LoraNotEnabled, LoraAdapterNotFound."""
        await asyncio.wrap_future(self.engine.unload_lora_adapter(name))

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread; its blocks are freed before the next step."""
        self._inbox.put(("abort", request_id))

    def abort_all(self) -> None:
        """Abort, from any thread, every request submitted before this call (graceful shutdown
        after its grace period). Each ends with finish_reason "abort"; its blocks are freed."""
        self._inbox.put(("abort_all", None))

    def shutdown(self) -> None:
        """Stop the engine thread after the current step (running requests are aborted)."""
        self._stopping = True
        self._inbox.put(("stop", None))
        self._thread.join(timeout=30)

    def _wake(self) -> None:
        self._inbox.put(("wake", None))

    def _drain_inbox(self, block: bool) -> None:
        while True:
            try:
                if block:
                    kind, payload = self._inbox.get(timeout=self._deadlines.wait_s(_IDLE_WAIT_S))
                else:
                    kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if kind == "add":
                self._add(payload)
            elif kind == "abort":
                self.engine.abort_request(payload)
            elif kind == "abort_all":
                outputs = [self.engine.abort_request(rid) for rid in list(self.engine.requests)]
                self._deliver([out for out in outputs if out is not None])

    def _add(self, request: EngineRequest) -> None:
        try:
            self.engine.add_request(request, validated=True)   # generate() validated it
            self._deadlines.add(request.request_id, request.arrival_time)
        except Exception as exc:  # noqa: BLE001 - reported to the request, the engine goes on
            logger.warning("request %s rejected: %s", request.request_id, exc)
            self._deliver([RequestOutput(request.request_id, [], len(request.prompt_token_ids),
                                         finished=True, error=exc)])
        finally:
            with self._lock:   # counted after add_request: briefly in both counts, never in neither
                self._num_added += 1

    def _expire_requests(self) -> None:
        """Abort the requests past `request_timeout_s`; each gets RequestTimedOut."""
        outputs = []
        for request_id in self._deadlines.expired(self.engine.requests):
            out = self.engine.abort_request(request_id)
            if out is not None:
                logger.warning("request %s: timed out after %g s; aborted", request_id, self._deadlines.timeout_s)
                out.error = RequestTimedOut(
                    f"the request did not finish within {self._deadlines.timeout_s:g} s (--request-timeout)")
                outputs.append(out)
        self._deliver(outputs)

    def _run(self) -> None:
        death = EngineDeadError("the engine has shut down")
        try:
            death = self._loop() or death
        except BaseException as exc:  # noqa: BLE001 - logged here; the thread ends, requests fail below
            logger.critical("the engine thread crashed", exc_info=exc)
            death = EngineDeadError(f"the engine thread crashed: {exc!r}")
        finally:
            self._fail_streams(death)

    def _loop(self) -> EngineDeadError | None:
        """Step until stopped (returns None) or until too many steps fail in a row (returns the
        error that every remaining request gets)."""
        torch.set_grad_enabled(False)
        consecutive_failures = 0
        while not self._stopping:
            try:
                # Block while there is nothing to run (idle, or every request awaits its grammar);
                # new requests, aborts and finished compiles all arrive through the inbox.
                self._drain_inbox(block=not self.engine.has_work() or not self.engine.last_step_scheduled)
                if self._stopping:
                    break
                if self.engine.has_work():
                    self._deliver(self.engine.step())
                self._expire_requests()
                consecutive_failures = 0
            except Exception as exc:  # noqa: BLE001 - the engine loop must report, not vanish
                # Fail the requests in flight and free their blocks; keep serving unless it repeats.
                consecutive_failures += 1
                ids = ",".join(self.engine.requests)
                logger.exception("engine step failed (requests %s); failing them", ids)
                self._deliver(self.engine.fail_all(EngineStepError(f"the engine step failed: {exc}")))
                if consecutive_failures >= self._max_consecutive_failures:
                    logger.critical("engine dead after %d failing steps in a row", consecutive_failures)
                    return EngineDeadError(f"the engine stopped after {consecutive_failures} failing steps: {exc}")
        for rid in list(self.engine.requests):
            self.engine.abort_request(rid)
        if self.engine.step_threads is not None:
            logger.info("step threads: %s", self.engine.step_threads.describe())
        return None

    def _fail_streams(self, error: EngineDeadError) -> None:
        """Mark the engine dead and fail every request still waiting for output with `error`;
        `generate()` checks the mark under the same lock, so no request is left waiting."""
        with self._lock:
            if self._dead is None:
                self._dead = error
            request_ids = list(self._streams)
        if request_ids:
            logger.error("failing %d waiting requests: %s", len(request_ids), error.message)
        self._deliver([RequestOutput(rid, [], 0, finished=True, error=EngineDeadError(error.message))
                       for rid in request_ids])

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[RequestOutput], RequestOutput]]] = {}
        with self._lock:
            for out in outputs:
                stream = self._streams.get(out.request_id)
                if stream is not None:
                    by_loop.setdefault(stream.loop, []).append((stream.queue, out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:
                logger.warning("event loop closed; dropping %d outputs", len(items))


def _put_all(items: list[tuple[asyncio.Queue[RequestOutput], RequestOutput]]) -> None:
    for q, out in items:
        q.put_nowait(out)


def _pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        # On CPUs without AVX512-BF16/AMX, float32 matmuls run ~4x faster than bfloat16.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _released_after(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on a worker thread, then that thread's OpenMP pool freed
    (engine/threads.py `release_openmp_threads`): the worker lives on in asyncio's executor, and
    its pool would slow the engine thread's parallel regions."""
    try:
        return fn(*args)
    finally:
        release_openmp_threads()

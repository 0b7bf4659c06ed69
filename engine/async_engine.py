"""AsyncEngine: the engine step loop on its own thread, with an asyncio-facing generate()."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import torch

from engine.config import EngineConfig
from engine.errors import EngineDeadError, EngineOverloaded, EngineStepError
from engine.llm_engine import LLMEngine
from engine.request import EngineRequest, RequestOutput
from engine.stats import EngineStats
from engine.threads import configure_threads
from lora.errors import LoraNotEnabled
from lora.registry import LoraAdapterInfo

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3   # steps failing in a row before the engine declares itself dead


@dataclass(slots=True)
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[RequestOutput]


class AsyncEngine:
    """Runs LLMEngine.step() in a loop on a dedicated thread; requests come in and outputs go
    out through thread-safe queues (`loop.call_soon_threadsafe`), one asyncio.Queue per request.

    A consumer that stops iterating `generate()` (disconnect, cancellation) aborts its request
    and the engine frees its blocks before the next step. If a step raises, every request
    fails with EngineDeadError and `is_healthy()` turns False.
    """

    def __init__(self, engine: LLMEngine, model_name: str, model_path: str) -> None:
        self.engine = engine
        engine.structured.on_ready = self._wake
        self.tokenizer = engine.tokenizer
        self.model_name = model_name
        self.model_path = model_path
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.arch.vocab_size
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()
        self._dead: BaseException | None = None
        self._stopping = False
        self._num_waiting = 0
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
        loaded = load_model(config.model, dtype=dtype, device=device, max_model_len=config.max_model_len)
        if device.type == "cpu":
            configure_threads(config.num_threads, loaded.arch.hidden_size, loaded.arch.intermediate_size)
        max_model_len = loaded.max_model_len
        torch.manual_seed(config.seed)
        engine = LLMEngine(config, loaded.model, loaded.arch, loaded.tokenizer, device, dtype, max_model_len)
        engine.structured.compiler.warm_up()
        logger.info("serving %s: dtype=%s, %.1fM parameters, KV cache %d blocks x %d tokens (%d tokens), "
                    "max_model_len %d", loaded.name, str(dtype).removeprefix("torch."), loaded.num_params / 1e6,
                    engine.runner.num_blocks, config.block_size, engine.runner.num_blocks * config.block_size,
                    max_model_len)
        return cls(engine, config.served_model_name or loaded.name, loaded.path)

    def stats(self) -> EngineStats:
        """A snapshot of the engine's counters and gauges (engine/stats.py)."""
        return self.engine.stats()

    def is_healthy(self) -> bool:
        """False once the engine thread has died or shut down."""
        return self._dead is None and self._thread.is_alive()

    async def generate(self, request: EngineRequest) -> AsyncIterator[RequestOutput]:
        """Submit `request` and yield its outputs until the last (finished=True).

        Raises ContextLengthExceeded / InvalidSamplingParams before the first yield,
        EngineDeadError when the engine is not running, EngineOverloaded when too many wait.
        """
        if not self.is_healthy():
            raise EngineDeadError("the engine is not running")
        if self._num_waiting >= self.engine.config.max_waiting_requests:
            raise EngineOverloaded("too many requests are waiting; retry later")
        self.engine.validate(request)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        with self._lock:
            self._streams[request.request_id] = stream
        self._num_waiting += 1
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
        return self.engine.lora is not None

    def lora_adapters(self) -> list[LoraAdapterInfo]:
        """The loaded LoRA adapters in load order (empty when LoRA is off); any thread."""
        lora = self.engine.lora
        return [] if lora is None else lora.registry.adapters()

    async def load_lora_adapter(self, name: str, path: str, replace: bool = False) -> LoraAdapterInfo:
        """Read and validate the PEFT folder `path` in a worker thread and serve it as `name`.
        Raises LoraNotEnabled, InvalidLoraAdapter, LoraAdapterExists (unless `replace`)."""
        if self.engine.lora is None:
            raise LoraNotEnabled("LoRA is off; start the server with --enable-lora")
        return await asyncio.to_thread(self.engine.lora.registry.load, name, path, None, replace)

    async def unload_lora_adapter(self, name: str) -> None:
        """Stop accepting `name` at once; returns when no request uses it any more (running ones
        finish on its weights). Raises LoraNotEnabled, LoraAdapterNotFound."""
        if self.engine.lora is None:
            raise LoraNotEnabled("LoRA is off; start the server with --enable-lora")
        await asyncio.wrap_future(self.engine.lora.registry.unload(name))

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread; its blocks are freed before the next step."""
        self._inbox.put(("abort", request_id))

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
                kind, payload = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if kind == "add":
                self._num_waiting -= 1
                try:
                    self.engine.add_request(payload)
                except Exception as exc:  # noqa: BLE001 - reported to the request, the engine goes on
                    logger.warning("request %s rejected: %s", payload.request_id, exc)
                    self._deliver([RequestOutput(payload.request_id, [], len(payload.prompt_token_ids),
                                                 finished=True, error=exc)])
            elif kind == "abort":
                self.engine.abort_request(payload)

    def _run(self) -> None:
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
                consecutive_failures = 0
            except Exception as exc:  # noqa: BLE001 - the engine loop must report, not vanish
                # Fail the requests in flight and free their blocks; keep serving unless it repeats.
                consecutive_failures += 1
                ids = ",".join(self.engine.requests)
                logger.exception("engine step failed (requests %s); failing them", ids)
                self._deliver(self.engine.fail_all(EngineStepError(f"the engine step failed: {exc}")))
                if consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                    self._dead = exc
                    return
        for rid in list(self.engine.requests):
            self.engine.abort_request(rid)
        self._dead = EngineDeadError("the engine has shut down")

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
